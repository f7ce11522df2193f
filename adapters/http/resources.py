"""Small resources: models, health, tokenize, detokenize and the OpenAPI document."""

from __future__ import annotations

from pathlib import Path

import falcon
import falcon.asgi
import yaml

from adapters.http.body import read_json
from adapters.http.fields import read_bool, read_int_list, read_object, read_str
from adapters.http.parsing import chat_request
from adapters.http.serving import HttpSettings, ModelHolder, ServedModel
from domain.common.errors import InvalidRequestError, UnhealthyError
from domain.common.ranges import check_token_ids
from domain.presentation.objects import model_list


class ModelsResource:
    def __init__(self, holder: ModelHolder) -> None:
        self._holder = holder

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        served = self._holder.served
        resp.media = model_list(
            served.name,
            served.created,
            served.engine.max_model_len,
            allow_logprobs=served.allow_logprobs,
        )


class HealthResource:
    def __init__(self, holder: ModelHolder) -> None:
        self._holder = holder

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        failure = self._holder.served.failure()  # raises 503 while the model loads
        if failure is not None:
            raise UnhealthyError(f"the model can no longer run: {failure}")
        resp.status = falcon.HTTP_200
        resp.content_type = falcon.MEDIA_TEXT
        resp.text = ""


class TokenizeResource:
    """`POST /tokenize`: a prompt string, or chat messages rendered through the template."""

    def __init__(self, holder: ModelHolder, settings: HttpSettings) -> None:
        self._holder = holder
        self._settings = settings

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        served = self._holder.served
        body = read_object(await read_json(req, self._settings.max_body_bytes))
        tokens = _tokenize(body, served)
        served.check_model(read_str(body, "model", None))
        resp.media = {
            "count": len(tokens),
            "max_model_len": served.engine.max_model_len,
            "tokens": tokens,
            "token_strs": None,
        }


def _tokenize(body: dict, served: ServedModel) -> list[int]:
    if "messages" in body:
        return list(chat_request({**body, "max_tokens": 1}, served.tokenizer).prompts[0].token_ids)
    prompt = read_str(body, "prompt", None)
    if prompt is None:
        raise InvalidRequestError("`prompt` or `messages` is required", param="prompt")
    add_special = read_bool(body, "add_special_tokens", True)
    return served.tokenizer.encode(prompt, add_special_tokens=add_special)


class DetokenizeResource:
    def __init__(self, holder: ModelHolder, settings: HttpSettings) -> None:
        self._holder = holder
        self._settings = settings

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        served = self._holder.served
        body = read_object(await read_json(req, self._settings.max_body_bytes))
        if body.get("tokens") is None:
            raise InvalidRequestError("`tokens` is required", param="tokens")
        tokens = read_int_list(body, "tokens")
        check_token_ids(tokens, served.tokenizer.vocab_size, "tokens")
        served.check_model(read_str(body, "model", None))
        resp.media = {"prompt": served.tokenizer.decode(tokens, skip_special_tokens=False)}


class OpenApiResource:
    """Serves `contracts/openapi.yaml` as JSON; read once when the app is built."""

    def __init__(self, path: Path) -> None:
        self._document = yaml.safe_load(path.read_text(encoding="utf-8"))

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.media = self._document
