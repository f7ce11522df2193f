"""The engine client port: how a front end hands requests to the engine and gets them back."""

from __future__ import annotations

from typing import Protocol

from domain.channel import OutputChannel
from domain.requests import GenerationRequest


class EngineClient(Protocol):
    """Accepts validated requests and streams their outputs through bounded channels.

    Invariants an implementation keeps:
    - `check` raises `InvalidRequestError` for a request the engine would refuse, admitting nothing.
    - `submit` returns at once; every submitted request ends with exactly one `RequestEnd` on its
      channel, also when it is aborted or fails.
    - `abort` of an unknown or finished request does nothing.
    """

    @property
    def max_model_len(self) -> int: ...

    def check(self, request: GenerationRequest) -> None: ...

    def submit(self, request: GenerationRequest, channel: OutputChannel) -> OutputChannel: ...

    def abort(self, request_id: str) -> None: ...
