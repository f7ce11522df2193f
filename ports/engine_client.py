"""The engine client port: how a front end hands requests to the engine and gets them back."""

from __future__ import annotations

from typing import Protocol

from domain.emission.channel import OutputChannel
from domain.requests.engine_request import CheckedRequest, EngineRequest


class EngineClient(Protocol):
    """Accepts validated requests and streams their outputs through bounded channels.

    Invariants an implementation keeps:
    - `check` raises `InvalidRequestError` for a request the engine would refuse, admitting
      nothing, and otherwise returns it as a `CheckedRequest`. A request with a grammar may
      block for up to the grammar compile budget, so an event-loop caller checks those on a
      thread.
    - `submit_all` queues requests that this client checked (never checking them again), all of
      them or, when its admission queue is full, none. It returns at once, or, where
      `submit_waits`, once the engine in another process answered, so an event-loop caller
      submits on a thread. Every queued request ends with exactly one `RequestEnd` on its
      channel, also when it is aborted or fails.
    - `abort` of an unknown or finished request does nothing.
    """

    @property
    def max_model_len(self) -> int: ...

    @property
    def submit_waits(self) -> bool: ...

    def check(self, request: EngineRequest) -> CheckedRequest: ...

    def submit_all(self, submissions: list[tuple[CheckedRequest, OutputChannel]]) -> None: ...

    def abort(self, request_id: str) -> None: ...
