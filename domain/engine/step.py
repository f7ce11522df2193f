"""What one step asks of the model executor: per-slot work and the executor's fixed geometry."""

from __future__ import annotations

from dataclasses import dataclass

from domain.contract.records import CompletionRecord
from domain.logprobs.prompt_scores import PromptScore
from domain.logprobs.values import PositionLogprobs
from domain.requests.choice_sampling import LaneSampling
from domain.speculation.choice import DraftLane
from domain.structured.constraint import GrammarLane


@dataclass(frozen=True, slots=True)
class ExecutorGeometry:
    """Fixed sizes of a loaded executor; the scheduler plans within them."""

    capacity: int
    block_size: int
    num_blocks: int
    vocab_size: int
    max_model_len: int
    token_capacity: int
    logprob_top_k: int = 0
    selects_logprob_ids: bool = False
    # Row capacities of the prepared scored-prefill operation, ascending; empty: no scoring.
    scored_capacities: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        sizes = ("capacity", "block_size", "num_blocks", "vocab_size", "max_model_len")
        for name in (*sizes, "token_capacity"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")
        capacities = self.scored_capacities
        if any(c < 1 for c in capacities) or list(capacities) != sorted(set(capacities)):
            raise ValueError(f"scored capacities must ascend and be positive, got {capacities}")

    @property
    def scores_prompts(self) -> bool:
        return bool(self.scored_capacities)

    @property
    def scored_token_limit(self) -> int:
        """Rows one scored prefill holds at most (0 without scoring)."""
        return self.scored_capacities[-1] if self.scored_capacities else 0


@dataclass(frozen=True, slots=True)
class SlotWork:
    """One lane of a step: feed a chunk of a sequence, and maybe sample the next token.

    `token_ids` occupy positions `start_position ..`; the cache already holds the positions before.
    Positions below `prompt_len` are prompt tokens (repetition penalty), the rest generated ones.
    When `sample` is set the commit emits by `sampling` (`domain.engine.commit`).

    Each feature adds one optional part. A `speculation` lane goes through verification (see
    `DraftLane`): its drafts are its last fed tokens, every fed token's row is a target row, and
    the commit emits the accepted drafts and one more token from `first_emitted_position` on. A
    `grammar` lane samples from its grammar's allowed set (`GrammarLane`). A lane with a
    `forced_token` (the thinking budget's forced end) emits that token instead of sampling one:
    the record's forced mask marks it, no logprob is reduced and nothing drawn for it; such a lane
    neither speculates nor is constrained. A scored prefill lane carries, per fed token, the
    prompt token its row scores, or -1 for no score (`prompt_targets`).
    """

    slot: int
    epoch: int
    token_ids: tuple[int, ...]
    start_position: int
    block_table: tuple[int, ...]
    prompt_len: int
    sample: bool
    sampling: LaneSampling
    prompt_targets: tuple[int, ...] = ()
    speculation: DraftLane | None = None
    grammar: GrammarLane | None = None
    forced_token: int | None = None

    def __post_init__(self) -> None:
        if not self.token_ids or self.start_position < 0:
            raise ValueError("a lane feeds at least one token from a non-negative position")
        if self.speculation is not None and not self.sample:
            raise ValueError("a speculative lane verifies, so it samples")
        drafts = self.drafts
        if drafts and (
            self.token_ids[-len(drafts) :] != drafts or len(drafts) >= len(self.token_ids)
        ):
            raise ValueError("drafts are the last fed tokens of a speculative lane, after one more")
        feed = self.speculation.draft_feed if self.speculation is not None else ()
        if (
            feed
            and self.speculation
            and self.speculation.draft_start + len(feed) != self.end_position
        ):
            raise ValueError("the draft model catches up to the lane's last fed token")
        if self.prompt_targets and len(self.prompt_targets) != len(self.token_ids):
            raise ValueError(
                f"{len(self.prompt_targets)} prompt targets for {len(self.token_ids)} tokens"
            )
        if self.forced_token is not None and (
            not self.sample or self.speculation is not None or self.grammar is not None
        ):
            raise ValueError("a forced token is emitted by a plain sampling lane, unconstrained")
        if self.grammar is not None and self.grammar.start < self.prompt_len:
            raise ValueError("a grammar starts at a generated position")

    @property
    def drafts(self) -> tuple[int, ...]:
        return () if self.speculation is None else self.speculation.drafts

    @property
    def end_position(self) -> int:
        return self.start_position + len(self.token_ids)

    @property
    def first_emitted_position(self) -> int:
        """Where the first token this lane emits goes: after the last fed non-draft token."""
        return self.end_position - len(self.drafts)


@dataclass(frozen=True, slots=True)
class StepPlan:
    """All lanes of one submission; each slot appears at most once.

    A scored plan selects the scored-prefill operation: every lane carries prompt targets and
    ordinary lanes never share it (scored prompts never enter the prompt role of a mixed step).
    """

    works: tuple[SlotWork, ...]
    scored: bool = False

    def __post_init__(self) -> None:
        slots = [work.slot for work in self.works]
        if len(set(slots)) != len(slots):
            raise ValueError("a slot appears twice in one step")
        if any(bool(work.prompt_targets) != self.scored for work in self.works):
            raise ValueError("scored plans hold scored lanes only, and only they carry targets")

    @property
    def num_tokens(self) -> int:
        return sum(len(work.token_ids) for work in self.works)


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

    def lane_logprobs(self, lane: int) -> tuple[PositionLogprobs, ...] | None:
        """Lane `lane`'s decoded positions, or None when the frame carries none for it."""
        return self.logprobs[lane] if lane < len(self.logprobs) else None
