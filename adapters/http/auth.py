"""API-key check for every route but `/health` (vLLM's `--api-key` guards `/v1` routes only)."""

from __future__ import annotations

import hmac

import falcon.asgi

from domain.common.errors import AuthenticationError

# Load balancers and orchestrators probe readiness without credentials.
OPEN_PATH = "/health"


class ApiKeyMiddleware:
    """Runs before routing, so an unknown route without the key is a 401, not a 404."""

    def __init__(self, api_key: str) -> None:
        self._expected = f"Bearer {api_key}".encode()

    async def process_request(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        if req.path == OPEN_PATH:
            return
        given = (req.get_header("Authorization") or "").encode()
        if not hmac.compare_digest(given, self._expected):
            raise AuthenticationError("Unauthorized: a valid API key is required")
