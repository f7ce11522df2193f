"""The model executor port: runs planned steps and returns their completion records."""

from __future__ import annotations

from typing import Protocol

from domain.contract.frames import FrameResult
from domain.contract.geometry import ExecutorGeometry
from domain.engine.step import StepPlan


class ModelExecutor(Protocol):
    """Runs the model over planned lanes and commits ABI6 records into alternating frames.

    Invariants an implementation keeps:
    - `submit` writes one record per lane into frame `f` (0 and 1 alternate per submission); a
      sampling lane's record has role SAMPLE and emits what `domain.engine.commit.commit_round`
      returns for the lane's sampled tokens, with that finish; a lane that only feeds prompt
      tokens has role PROMPT and emits nothing.
    - A speculative lane (`SlotWork.speculation`) verifies its drafts (history drafts fed after
      its last token, or the `propose` drafts its `DraftLane` asks of the executor's draft
      model): its record has role SPECULATIVE, `drafts offered`, and emits what `commit_round`
      returns for the accepted drafts plus the target's own next token, from
      `first_emitted_position`, with the accepted drafts it returns (those emitted: a stop or
      the length limit clips them).
      Greedy lanes keep drafts equal to the target's choice.
    - `read(f)` returns that frame's records and, for requesting lanes only, their decoded
      logprob positions (one per emitted token, from the raw target row that chose it, with the
      alternatives the lane asked for: its K natural ones, none at K = 0, or its selected IDs);
      the frame is free for reuse after it returns.
    - `submit` may leave the frame's commit (its records, and what `read` reports) for later when
      the plan `domain.overlap.late_commit.commits_late`: it is done after the next submission
      is launched, or by `settle(f)`, which `read(f)` does first. `land()` waits for such a
      step's tokens without committing it and returns its frame (None when no step waits);
      the next `submit` then launches at once. Only the thread that submits calls `land` and
      `settle`, so a reader on another thread has the submitting thread settle the frame
      before it reads.
    - A seeded lane samples the same token whatever else is in the batch.
    - A scored plan (only when the geometry declares scored capacities) also scores each lane's
      rows against their prompt targets; it advances the cache exactly as prefill does.
    - A failure of one lane's own (its grammar breaks while it runs) retires that lane and
      never raises: its record has role INVALID, emits nothing and finishes with ERROR, `read`
      lists a `LaneFailure` for it whose message speaks of that lane only, and the other lanes
      commit as if it were not there. `submit` raises only for what fails the whole step.
    """

    @property
    def geometry(self) -> ExecutorGeometry: ...

    def submit(self, plan: StepPlan) -> int: ...

    def land(self) -> int | None: ...

    def settle(self, frame: int) -> None: ...

    def read(self, frame: int) -> FrameResult: ...
