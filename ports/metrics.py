"""Metrics ports: what the engine and the HTTP front end report, in domain values."""

from __future__ import annotations

from typing import Protocol

from domain.telemetry.step_stats import StepStats


class EngineObserver(Protocol):
    """Receives the engine's StepStats, one per step that changed anything.

    Invariants an implementation keeps:
    - `record_step` is called from the engine thread only, in step order; counts in the stats
      are increments, `state` is the occupancy after the step.
    - It returns quickly and never blocks on I/O: the engine waits for it between steps.
    - Raising is a bug; the engine logs it and serves on, so the step's stats are lost.
    """

    def record_step(self, stats: StepStats) -> None: ...


class RejectionObserver(Protocol):
    """Counts requests the front end answered with an error envelope, by a short reason
    (`invalid_request`, `not_found`, `overloaded`, ...); called from any request handler."""

    def request_rejected(self, reason: str) -> None: ...
