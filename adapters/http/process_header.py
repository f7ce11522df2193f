"""Names the API process that answered, where several serve one engine."""

from __future__ import annotations

import os

import falcon.asgi

# The process ID of the HTTP process that answered: with `--api-server-count` above 1 it tells
# which process served a request (and lets tests prove that both do).
HEADER = "x-helios-api-server"


class ProcessHeaderMiddleware:
    async def process_response(
        self,
        req: falcon.asgi.Request,
        resp: falcon.asgi.Response,
        resource: object,
        req_succeeded: bool,
    ) -> None:
        resp.set_header(HEADER, str(os.getpid()))
