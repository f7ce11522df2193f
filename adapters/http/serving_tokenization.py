"""`POST /tokenize` and `POST /detokenize`: a prompt or chat messages to token IDs, and back."""

from __future__ import annotations

import falcon.asgi

from adapters.http.body import PostEndpoint
from adapters.http.requests.tokenization import detokenize_request, tokenize_request


class TokenizeResource(PostEndpoint):
    """A prompt string, or chat messages rendered through the template."""

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        served = self._holder.served
        tokens, model = tokenize_request(await self._body(req), served.tokenizer)
        served.check_model(model)
        resp.media = {
            "count": len(tokens),
            "max_model_len": served.engine.max_model_len,
            "tokens": tokens,
            "token_strs": None,
        }


class DetokenizeResource(PostEndpoint):
    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        served = self._holder.served
        tokens, model = detokenize_request(await self._body(req), served.tokenizer.vocab_size)
        served.check_model(model)
        resp.media = {"prompt": served.tokenizer.decode(tokens, skip_special_tokens=False)}
