"""`POST /tokenize` and `POST /detokenize`: a prompt or chat messages to token IDs, and back."""

from __future__ import annotations

import falcon.asgi

from adapters.http.body import PostEndpoint
from adapters.http.requests.tokenization import detokenize_request, tokenize_request
from adapters.http.serving import ServedModel


class TokenizeResource(PostEndpoint):
    """A prompt string, or chat messages rendered through the template."""

    async def respond(self, served: ServedModel, raw: bytes, resp: falcon.asgi.Response) -> None:
        tokens, model = tokenize_request(raw, served.tokenizer)
        served.check_model(model)
        resp.media = {
            "count": len(tokens),
            "max_model_len": served.engine.max_model_len,
            "tokens": tokens,
            "token_strs": None,
        }


class DetokenizeResource(PostEndpoint):
    async def respond(self, served: ServedModel, raw: bytes, resp: falcon.asgi.Response) -> None:
        tokens, model = detokenize_request(raw, served.tokenizer.vocab_size)
        served.check_model(model)
        resp.media = {"prompt": served.tokenizer.decode(tokens, skip_special_tokens=False)}
