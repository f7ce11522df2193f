"""What engine steps did, for metrics: counts, observed latencies and the scheduler's occupancy."""

from __future__ import annotations

from dataclasses import dataclass

# Why a choice ended, as vLLM labels `request_success` (its FinishReason strings).
FINISH_REASONS = ("stop", "length", "abort", "error")


@dataclass(frozen=True, slots=True)
class SchedulerState:
    """Occupancy after a step: sequences running and waiting, and the fraction of KV blocks held."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0


@dataclass(frozen=True, slots=True)
class SchedulerTotals:
    """Running totals a scheduler keeps: preemptions, and the prompt tokens its prefix cache
    was asked for and found (vLLM's `prefix_cache_queries` and `prefix_cache_hits`)."""

    preemptions: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0


@dataclass(frozen=True, slots=True)
class StepStats:
    """Everything one engine step (or several quiet ones) changed, in one value per step.

    Counts are increments since the previous StepStats; `state` is the occupancy now. Latency
    tuples hold one observation each: queue time at a choice's first scheduling, time to first
    token at its first token, inter-token time at every later token.
    """

    state: SchedulerState
    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    queue_times: tuple[float, ...] = ()
    first_token_times: tuple[float, ...] = ()
    inter_token_times: tuple[float, ...] = ()
    logprob_positions: int = 0
    logprob_payload_bytes: int = 0
    prompt_rows_scored: int = 0
    finished: tuple[FinishedChoice, ...] = ()
    # Speculation: rounds that offered drafts, drafts offered and accepted, and per draft
    # position i the rounds whose first i + 1 drafts stood.
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_accepted_per_position: tuple[int, ...] = ()
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0


@dataclass(frozen=True, slots=True)
class FinishedChoice:
    """A choice that ended: one of FINISH_REASONS, and seconds from its request's arrival."""

    reason: str
    e2e_seconds: float
