"""What one step asks of the model executor: per-slot work and the executor's fixed geometry."""

from __future__ import annotations

from dataclasses import dataclass

from domain.contract.records import CompletionRecord
from domain.logprobs.prompt_scores import PromptScore
from domain.logprobs.values import LogprobOptions, PositionLogprobs
from domain.requests.sampling import SamplingParams
from domain.structured.grammar import GrammarSpec


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
        for name in (
            "capacity",
            "block_size",
            "num_blocks",
            "vocab_size",
            "max_model_len",
            "token_capacity",
        ):
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
    When `sample` is set the commit emits one token, ends the request with STOP_TOKEN when it is in
    `stop_token_ids`, or with LENGTH when `remaining` reaches zero; `banned_token_ids` cannot be
    sampled (min_tokens).

    A `speculative` lane goes through verification: its last fed tokens are `drafts` (none in a
    width-one round), every fed token's row is a target row, and the commit emits the accepted
    drafts and one more token (`domain.engine.commit.commit_round` clips them), from position
    `first_emitted_position` on.

    A lane with a `grammar` samples every token from its grammar's allowed set (each target row
    of a speculative lane under the grammar's state after the drafts before it); the grammar
    walks the fed tokens at positions from `grammar_start` on (`prompt_len` when None; later
    when the output began with reasoning), then what its records emit. A choice whose grammar
    has not started yet (reasoning still open) has no `grammar` on its lanes.

    A lane with a `forced_token` (the thinking budget's forced end) emits that token instead of
    sampling one: the commit marks it in the record's forced mask, no logprob is reduced for
    it, and nothing is drawn for its position. Such a lane neither speculates nor is
    constrained (its grammar, if any, starts after the forced end).
    """

    slot: int
    epoch: int
    token_ids: tuple[int, ...]
    start_position: int
    block_table: tuple[int, ...]
    prompt_len: int
    sample: bool
    params: SamplingParams
    seed: int
    stop_token_ids: frozenset[int] = frozenset()
    banned_token_ids: tuple[int, ...] = ()
    remaining: int = 1
    logprobs: LogprobOptions | None = None
    # Scored prefill only: per fed token, the prompt token its row scores, or -1 for no score.
    prompt_targets: tuple[int, ...] = ()
    speculative: bool = False
    drafts: tuple[int, ...] = ()
    # Draft-model lanes: drafts the executor's draft model proposes after `token_ids`, and the
    # tokens it must catch up on first (positions `draft_start ..`, the lane's last included).
    propose: int = 0
    draft_feed: tuple[int, ...] = ()
    draft_start: int = 0
    grammar: GrammarSpec | None = None
    # The position of the first token the grammar constrains; None: `prompt_len`.
    grammar_start: int | None = None
    forced_token: int | None = None

    def __post_init__(self) -> None:
        if not self.token_ids:
            raise ValueError("a lane must feed at least one token")
        if self.speculative and not self.sample:
            raise ValueError("a speculative lane verifies, so it samples")
        if self.drafts and (
            not self.speculative
            or self.token_ids[len(self.token_ids) - len(self.drafts) :] != self.drafts
            or len(self.drafts) >= len(self.token_ids)
        ):
            raise ValueError("drafts are the last fed tokens of a speculative lane, after one more")
        if self.propose and (not self.speculative or self.drafts or not self.draft_feed):
            raise ValueError("a lane proposing drafts verifies them, has none yet, feeds its draft")
        if self.draft_feed and self.draft_start + len(self.draft_feed) != self.end_position:
            raise ValueError("the draft model catches up to the lane's last fed token")
        if self.prompt_targets and len(self.prompt_targets) != len(self.token_ids):
            raise ValueError(
                f"{len(self.prompt_targets)} prompt targets for {len(self.token_ids)} tokens"
            )
        if self.start_position < 0:
            raise ValueError("start_position must be non-negative")
        if self.sample and self.remaining < 1:
            raise ValueError("a sampling lane needs a remaining budget of at least one token")
        if self.forced_token is not None and (
            not self.sample or self.speculative or self.grammar is not None
        ):
            raise ValueError("a forced token is emitted by a plain sampling lane, unconstrained")
        if self.grammar_start is not None and self.grammar_start < self.prompt_len:
            raise ValueError("a grammar starts at a generated position")

    @property
    def constrained_from(self) -> int:
        """The position of the first token the lane's grammar walks."""
        return self.prompt_len if self.grammar_start is None else self.grammar_start

    @property
    def end_position(self) -> int:
        return self.start_position + len(self.token_ids)

    @property
    def first_emitted_position(self) -> int:
        """Where the first token this lane emits goes: after the last fed non-draft token."""
        return self.end_position - len(self.drafts)

    @property
    def max_drafts(self) -> int:
        """Drafts this lane verifies at most: its history drafts, or what its draft model
        proposes."""
        return len(self.drafts) or self.propose


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
