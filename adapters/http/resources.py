"""Small resources: models, health and the OpenAPI document."""

from __future__ import annotations

from pathlib import Path

import falcon
import falcon.asgi
import yaml

from adapters.http.serving import ModelHolder
from domain.common.errors import UnhealthyError
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


class OpenApiResource:
    """Serves `contracts/openapi.yaml` as JSON; read once when the app is built."""

    def __init__(self, path: Path) -> None:
        self._document = yaml.safe_load(path.read_text(encoding="utf-8"))

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.media = self._document
