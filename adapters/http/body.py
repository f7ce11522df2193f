"""A POST endpoint's request body, read within the size limit."""

from __future__ import annotations

import falcon.asgi

from adapters.http.serving import HttpSettings, ModelHolder, ServedModel
from domain.common.errors import PayloadTooLargeError


async def read_body(req: falcon.asgi.Request, max_bytes: int) -> bytes:
    if req.content_length is not None and req.content_length > max_bytes:
        raise PayloadTooLargeError(f"the request body exceeds {max_bytes} bytes")
    raw = await req.stream.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise PayloadTooLargeError(f"the request body exceeds {max_bytes} bytes")
    return raw


class PostEndpoint:
    """A route that takes a JSON body: the served model's holder and the front-end settings."""

    def __init__(self, holder: ModelHolder, settings: HttpSettings) -> None:
        self._holder = holder
        self._settings = settings

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        served = self._holder.served  # a 503 while the model loads, before the body is read
        await self.respond(served, await read_body(req, self._settings.max_body_bytes), resp)

    async def respond(self, served: ServedModel, raw: bytes, resp: falcon.asgi.Response) -> None:
        """Answers the body `raw`, as yet undecoded."""
        raise NotImplementedError
