"""What the host reads back from one submitted step: its records, payload and retired lanes."""

from __future__ import annotations

from dataclasses import dataclass

from domain.contract.records import CompletionRecord
from domain.logprobs.prompt_scores import PromptScore
from domain.logprobs.values import PositionLogprobs


@dataclass(frozen=True, slots=True)
class LaneFailure:
    """A lane its executor retired in a step, for a reason of that lane's own (its grammar broke
    mid-output, say): its request fails with `message`, and the step's other lanes go on.

    `message` speaks of that request only, never of another lane. `param` names the request
    field at fault when the failure is the request's own input (its output constraint), else
    None (a server-side failure of that request).
    """

    slot: int
    epoch: int
    message: str
    param: str | None = None

    def __post_init__(self) -> None:
        if self.slot < 0 or self.epoch < 0 or not self.message:
            raise ValueError("a lane failure names a live slot and epoch, and says why")


@dataclass(frozen=True, slots=True)
class FrameResult:
    """The records of one completed submission, one per lane of its plan, in plan order.

    `logprobs[i]` holds lane i's decoded positions (one per emitted token) when the lane
    requested logprobs, else None; an empty tuple means no lane of the frame requested any.
    `prompt_scores[i]` holds a scored plan's lane i rows (one per fed token, None for a row
    without a target); empty for ordinary plans.
    `payload_bytes` counts the logprob and prompt-score payload the read copied from the
    device's frames to the host (0 when it copied none).
    `failures` lists the lanes the executor retired; each one's record emits nothing and
    finishes with ERROR, and its request fails while the frame's other lanes commit.
    """

    frame: int
    records: tuple[CompletionRecord, ...]
    logprobs: tuple[tuple[PositionLogprobs, ...] | None, ...] = ()
    prompt_scores: tuple[tuple[PromptScore | None, ...], ...] = ()
    payload_bytes: int = 0
    failures: tuple[LaneFailure, ...] = ()

    @property
    def positions(self) -> int:
        """Logprob positions the frame decoded, over all lanes."""
        return sum(len(lane) for lane in self.logprobs if lane is not None)

    @property
    def scored_rows(self) -> int:
        """Prompt rows the frame scored (rows with a target), over all lanes."""
        return sum(1 for lane in self.prompt_scores for row in lane if row is not None)

    def lane_logprobs(self, lane: int) -> tuple[PositionLogprobs, ...] | None:
        """Lane `lane`'s decoded positions, or None when the frame carries none for it."""
        return self.logprobs[lane] if lane < len(self.logprobs) else None
