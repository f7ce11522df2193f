"""Server-sent events as vLLM writes them: `data: <json>` frames and a final `data: [DONE]`."""

from __future__ import annotations

from falcon.asgi import SSEvent

from adapters.http import wire_json
from domain.common.errors import DomainError
from domain.presentation.objects import error_object


class DataEvent(SSEvent):
    """A `data:` frame whose payload is text already: written as `data: <payload>` and a blank
    line, the bytes falcon's `SSEvent(data=...)` writes.

    falcon decodes the payload (to check it is UTF-8, which our JSON always is), formats a str
    and encodes it again: 2.2 us for a 1.2 KB K=20 chunk, against 0.35 us here.
    """

    __slots__ = ()

    def __init__(self, data: bytes) -> None:
        super().__init__(data=data)

    def serialize(self, handler: object = None) -> bytes:
        return b"data: %b\n\n" % (self.data or b"")


def json_event(payload: dict) -> SSEvent:
    """A `data:` frame of a completion or chat stream, its JSON written by `wire_json`."""
    return DataEvent(wire_json.encode(payload))


def done_event() -> SSEvent:
    return DataEvent(b"[DONE]")


def error_event(error: DomainError) -> SSEvent:
    """An error after the stream started: HTTP 200 was sent, so the error travels as a frame."""
    return SSEvent(json=error_object(error))
