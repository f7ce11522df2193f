"""Server-sent events as vLLM writes them: `data: <json>` frames and a final `data: [DONE]`."""

from __future__ import annotations

from falcon.asgi import SSEvent

from domain.common.errors import DomainError
from domain.presentation.objects import error_object


def json_event(payload: dict) -> SSEvent:
    return SSEvent(json=payload)


def done_event() -> SSEvent:
    return SSEvent(data=b"[DONE]")


def error_event(error: DomainError) -> SSEvent:
    """An error after the stream started: HTTP 200 was sent, so the error travels as a frame."""
    return SSEvent(json=error_object(error))
