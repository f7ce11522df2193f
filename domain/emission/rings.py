"""Consumers woken once a step: the ready calls of the channels a step delivered to."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import TracebackType

_log = logging.getLogger(__name__)


class ReadyRings:
    """While held (the engine's step, as a `with` block), a channel's ready call is kept, once
    per channel, and made when the step ends; outside a step it is made at once.

    A consumer woken at a step's first delivery read a part of the step: the engine process's
    socket writer sent about four messages a step to each API process at 64 streams (each a
    pickle, a write, a wake-up there) and took the engine thread's GIL turns while it did.
    Woken once the step has delivered to all, it reads the whole step in one go, as vLLM's
    engine core sends one batch of outputs a step. A lane's outputs reach its consumer at
    most the rest of the step's emission later.
    """

    def __init__(self) -> None:
        # Held and released by the engine thread, whose puts are the ones kept: a put from any
        # other thread calls at once, so no lock is needed (none on the per-delta path).
        self._owner: int | None = None
        self._held: dict[Callable[[], None], None] | None = None

    def ring(self, on_ready: Callable[[], None]) -> None:
        """`on_ready()` now, or when the step that holds the rings ends."""
        held = self._held
        if held is not None and threading.get_ident() == self._owner:
            held[on_ready] = None
        else:
            on_ready()

    def __enter__(self) -> ReadyRings:
        self._owner = threading.get_ident()
        self._held = {}
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        held, self._held = self._held or {}, None
        for on_ready in held:
            try:
                on_ready()
            except Exception:  # noqa: BLE001 - one consumer's wake-up must not cost the others
                _log.exception("waking a request's consumer failed")
