"""API-key check for `/v1` routes, as vLLM's `--api-key` does."""

from __future__ import annotations

import hmac

import falcon.asgi

from domain.errors import AuthenticationError


class ApiKeyMiddleware:
    def __init__(self, api_key: str) -> None:
        self._expected = f"Bearer {api_key}".encode()

    async def process_request(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        if not req.path.startswith("/v1"):
            return
        given = (req.get_header("Authorization") or "").encode()
        if not hmac.compare_digest(given, self._expected):
            raise AuthenticationError("Unauthorized: a valid API key is required")
