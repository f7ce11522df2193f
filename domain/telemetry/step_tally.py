"""Collects what happens during engine steps and hands it to the observer as one StepStats."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from domain.telemetry.step_stats import (
    FinishedChoice,
    SchedulerState,
    SchedulerTotals,
    StepStats,
)

if TYPE_CHECKING:  # the domain drives ports but never needs them at run time
    from ports.metrics import EngineObserver

_log = logging.getLogger(__name__)


@dataclass(slots=True)
class ChoiceTimeline:
    """When one choice's request arrived, and how far the choice got: latencies start here."""

    arrived: float
    scheduled: bool = False
    started: bool = False
    last_token: float | None = None


class StepTally:
    """Accumulates counts and latencies (timed by `clock`, seconds, monotonic) until `report`;
    only the engine thread touches it.

    With `interval_s` a report within that long of the last one waits, its counts carried to
    the next, unless the engine has gone idle: at hundreds of steps a second the observer's
    per-step work (Prometheus's gauges, counters and histograms, each a file write in
    multiprocess mode) was 3-4% of the engine thread, and scrapes come seconds apart.
    """

    def __init__(
        self,
        observer: EngineObserver | None,
        clock: Callable[[], float],
        interval_s: float = 0.0,
    ) -> None:
        self._observer = observer
        self._clock = clock
        self._interval_s = interval_s
        self._reported_at = -math.inf
        self._state = SchedulerState()
        self._totals_seen = SchedulerTotals()
        self._reset()

    def _reset(self) -> None:
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._queue_times: list[float] = []
        self._first_token_times: list[float] = []
        self._inter_token_times: list[float] = []
        self._finished: list[FinishedChoice] = []
        self._logprob_positions = 0
        self._payload_bytes = 0
        self._prompt_rows = 0
        self._spec_drafts = 0
        self._spec_draft_tokens = 0
        self._spec_accepted: list[int] = []
        self._dirty = False

    def scheduled(self, timeline: ChoiceTimeline) -> None:
        """A choice got a slot; only its first scheduling is a queue time."""
        if timeline.scheduled:
            return
        timeline.scheduled = True
        self._queue_times.append(self._clock() - timeline.arrived)
        self._dirty = True

    def output(self, timeline: ChoiceTimeline, tokens: int, prompt_tokens: int) -> None:
        """A choice's record committed `tokens` (0: a prefill-only choice ending).

        Its prompt counts with its first output, as vLLM counts a prompt once it is prefilled;
        a re-prefill after preemption does not count again.
        """
        now = self._clock()
        if not timeline.started:
            timeline.started = True
            self._prompt_tokens += prompt_tokens
            self._dirty = True
        if not tokens:
            return
        self._generation_tokens += tokens
        if timeline.last_token is None:
            self._first_token_times.append(now - timeline.arrived)
        else:
            self._inter_token_times.append(now - timeline.last_token)
        timeline.last_token = now
        self._dirty = True

    def finished(self, timeline: ChoiceTimeline, reason: str) -> None:
        self._finished.append(FinishedChoice(reason, self._clock() - timeline.arrived))
        self._dirty = True

    def frame_read(self, positions: int, payload_bytes: int, prompt_rows: int) -> None:
        """What a frame carried back: decoded logprob positions, payload bytes, scored rows."""
        if positions or payload_bytes or prompt_rows:
            self._logprob_positions += positions
            self._payload_bytes += payload_bytes
            self._prompt_rows += prompt_rows
            self._dirty = True

    def speculated(self, offered: int, accepted: int) -> None:
        """A verification round that offered drafts and kept the first `accepted` of them."""
        if not offered:
            return
        self._spec_drafts += 1
        self._spec_draft_tokens += offered
        if len(self._spec_accepted) < offered:
            self._spec_accepted.extend([0] * (offered - len(self._spec_accepted)))
        for position in range(accepted):
            self._spec_accepted[position] += 1
        self._dirty = True

    def report(self, state: SchedulerState, totals: SchedulerTotals, *, idle: bool = True) -> None:
        """Hands the stats since the last report to the observer, unless nothing changed (an
        idle step) or the engine, not `idle`, reported less than the interval ago; a failing
        observer never stops the engine."""
        if self._interval_s and not idle:
            now = self._clock()
            if now - self._reported_at < self._interval_s:
                return
            self._reported_at = now
        stats = self.flush(state, totals)
        if stats is None or self._observer is None:
            return
        try:
            self._observer.record_step(stats)
        except Exception:  # noqa: BLE001 - metrics are never worth a request
            _log.exception("the engine observer failed")

    def flush(self, state: SchedulerState, totals: SchedulerTotals) -> StepStats | None:
        """The stats since the last flush, or None when nothing changed."""
        seen = self._totals_seen
        if not self._dirty and totals == seen and state == self._state:
            return None
        stats = StepStats(
            state=state,
            prompt_tokens=self._prompt_tokens,
            generation_tokens=self._generation_tokens,
            preemptions=totals.preemptions - seen.preemptions,
            queue_times=tuple(self._queue_times),
            first_token_times=tuple(self._first_token_times),
            inter_token_times=tuple(self._inter_token_times),
            finished=tuple(self._finished),
            logprob_positions=self._logprob_positions,
            logprob_payload_bytes=self._payload_bytes,
            prompt_rows_scored=self._prompt_rows,
            spec_drafts=self._spec_drafts,
            spec_draft_tokens=self._spec_draft_tokens,
            spec_accepted_tokens=sum(self._spec_accepted),
            spec_accepted_per_position=tuple(self._spec_accepted),
            prefix_cache_queries=totals.prefix_cache_queries - seen.prefix_cache_queries,
            prefix_cache_hits=totals.prefix_cache_hits - seen.prefix_cache_hits,
        )
        self._state = state
        self._totals_seen = totals
        self._reset()
        return stats
