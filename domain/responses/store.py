"""Stored responses: what `previous_response_id` continues and `GET /v1/responses/{id}` returns."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# A server keeps at most this many responses, and at most this many bytes of them.
DEFAULT_MAX_RESPONSES = 256
DEFAULT_MAX_BYTES = 64 << 20
# A Python string holds at most four bytes per character; other scalars count as one word.
_BYTES_PER_CHARACTER = 4
_WORD = 8


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """A finished response as JSON text, and the conversation a follow-up continues: the
    messages its prompt was rendered from (without `instructions`, which do not carry over)
    followed by its own output as messages."""

    body: bytes
    conversation: tuple[Mapping[str, object], ...]
    size: int

    @staticmethod
    def of(body: bytes, conversation: Sequence[Mapping[str, object]]) -> StoredResponse:
        """`size` is what the store counts against its bound: the body's bytes plus every
        string of the conversation (content, roles, function-call names, ids and arguments,
        keys too) at four bytes a character, the most a Python string spends on one."""
        return StoredResponse(body, tuple(conversation), len(body) + _footprint(conversation))


def _footprint(value: object) -> int:
    """The bytes `value`'s strings may hold, nested containers included; other scalars count
    as one machine word."""
    if isinstance(value, str):
        return _BYTES_PER_CHARACTER * len(value)
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, Mapping):
        return sum(_footprint(key) + _footprint(item) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return sum(_footprint(item) for item in value)
    return _WORD


class ResponseStore:
    """Least recently used responses, bounded by count and by size; a response larger than the
    whole size bound is not kept. One store per server: in its one HTTP process, or, with
    several API processes, in the engine process, which they all ask."""

    def __init__(
        self, max_responses: int = DEFAULT_MAX_RESPONSES, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        if max_responses < 0 or max_bytes < 0:
            raise ValueError("store bounds must not be negative")
        self._max_responses = max_responses
        self._max_bytes = max_bytes
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, response_id: str, stored: StoredResponse) -> None:
        self._drop(response_id)
        if stored.size > self._max_bytes or self._max_responses == 0:
            return
        self._entries[response_id] = stored
        self._bytes += stored.size
        while len(self._entries) > self._max_responses or self._bytes > self._max_bytes:
            self._drop(next(iter(self._entries)))

    def get(self, response_id: str) -> StoredResponse | None:
        stored = self._entries.get(response_id)
        if stored is not None:
            self._entries.move_to_end(response_id)
        return stored

    def _drop(self, response_id: str) -> None:
        stored = self._entries.pop(response_id, None)
        if stored is not None:
            self._bytes -= stored.size
