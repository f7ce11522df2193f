"""The response store port: where finished responses wait for `previous_response_id`."""

from __future__ import annotations

from typing import Protocol

from domain.responses.store import StoredResponse


class ResponseStorage(Protocol):
    """Keeps finished responses by ID, the most recent ones within its bounds.

    Invariants an implementation keeps:
    - once `put` returns, a `get` of that ID from any HTTP process of the server finds the
      response (until the store lets it go), so a follow-up may reach any process;
    - `get` of an unknown or let-go ID returns None.
    """

    def put(self, response_id: str, stored: StoredResponse) -> None: ...

    def get(self, response_id: str) -> StoredResponse | None: ...
