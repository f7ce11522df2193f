"""The model executor port: runs planned steps and returns their completion records."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from domain.logprobs import PositionLogprobs
from domain.prompt_scores import PromptScore
from domain.records import CompletionRecord
from domain.step import ExecutorGeometry, StepPlan


@dataclass(frozen=True, slots=True)
class FrameResult:
    """The records of one completed submission, one per lane of its plan, in plan order.

    `logprobs[i]` holds lane i's decoded positions (one per emitted token) when the lane
    requested logprobs, else None; an empty tuple means no lane of the frame requested any.
    `prompt_scores[i]` holds a scored plan's lane i rows (one per fed token, None for a row
    without a target); empty for ordinary plans.
    `payload_bytes` counts the logprob and prompt-score payload the read copied from the
    device's frames to the host (0 when it copied none).
    """

    frame: int
    records: tuple[CompletionRecord, ...]
    logprobs: tuple[tuple[PositionLogprobs, ...] | None, ...] = ()
    prompt_scores: tuple[tuple[PromptScore | None, ...], ...] = ()
    payload_bytes: int = 0


class ModelExecutor(Protocol):
    """Runs the model over planned lanes and commits ABI6 records into alternating frames.

    Invariants an implementation keeps:
    - `submit` writes one record per lane into frame `f` (0 and 1 alternate per submission); a
      sampling lane's record has role SAMPLE, emits one token and carries the commit's finish;
      a lane that only feeds prompt tokens has role PROMPT and emits nothing.
    - `read(f)` returns that frame's records and, for requesting lanes only, their decoded
      logprob positions; the frame is free for reuse after it returns.
    - A seeded lane samples the same token whatever else is in the batch.
    - A scored plan (only when the geometry declares scored capacities) also scores each lane's
      rows against their prompt targets; it advances the cache exactly as prefill does.
    """

    @property
    def geometry(self) -> ExecutorGeometry: ...

    def submit(self, plan: StepPlan) -> int: ...

    def read(self, frame: int) -> FrameResult: ...
