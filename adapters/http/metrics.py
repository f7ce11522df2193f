"""`GET /metrics`: the Prometheus text exposition of the served model's metrics."""

from __future__ import annotations

from typing import Protocol

import falcon.asgi


class Exposition(Protocol):
    """Renders metrics in a text format named by `content_type`."""

    @property
    def content_type(self) -> str: ...

    def render(self) -> bytes: ...


class MetricsResource:
    def __init__(self, exposition: Exposition) -> None:
        self._exposition = exposition

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.content_type = self._exposition.content_type
        resp.data = self._exposition.render()
