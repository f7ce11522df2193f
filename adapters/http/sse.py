"""Server-sent events as vLLM writes them: `data: <json>` frames and a final `data: [DONE]`."""

from __future__ import annotations

from falcon.asgi import SSEvent

from adapters.http import wire_json
from domain.common.errors import DomainError
from domain.presentation.objects import error_object


def json_event(payload: dict) -> SSEvent:
    """A `data:` frame of a completion or chat stream, its JSON written by `wire_json`."""
    return SSEvent(data=wire_json.encode(payload))


def done_event() -> SSEvent:
    return SSEvent(data=b"[DONE]")


def error_event(error: DomainError) -> SSEvent:
    """An error after the stream started: HTTP 200 was sent, so the error travels as a frame."""
    return SSEvent(json=error_object(error))
