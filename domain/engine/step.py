"""What one step asks of the model executor: its lanes, each with its features' parts."""

from __future__ import annotations

from dataclasses import dataclass

from domain.common.frozen import quick_init
from domain.requests.choice_sampling import LaneSampling
from domain.speculation.choice import DraftLane
from domain.structured.constraint import GrammarLane


@quick_init
@dataclass(frozen=True, slots=True)
class SlotWork:
    """One lane of a step: feed a chunk of a sequence, and maybe sample the next token.

    `token_ids` occupy positions `start_position ..`; the cache already holds the positions before.
    Positions below `prompt_len` are prompt tokens (repetition penalty), the rest generated ones.
    When `sample` is set the commit emits by `sampling` (`domain.engine.commit`).

    Each feature adds one optional part. A `speculation` lane goes through verification (see
    `DraftLane`): its drafts are its last fed tokens, every fed token's row is a target row, and
    the commit emits the accepted drafts and one more token from `first_emitted_position` on. A
    `grammar` lane samples from its grammar's allowed set (`GrammarLane`). A `forced_token` (the
    thinking budget's forced end) is emitted instead of a sampled one: the record's forced mask
    marks it, no logprob is reduced and nothing drawn for it; its lane neither speculates nor is
    constrained. A scored prefill lane carries, per fed token, the prompt token its row scores
    (-1: none) in `prompt_targets`.
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
        fed = len(self.token_ids) - len(self.drafts)
        if fed < 1 or self.token_ids[fed:] != self.drafts:
            raise ValueError("drafts are the last fed tokens of a speculative lane, after one more")
        lane = self.speculation
        if (
            lane
            and lane.draft_feed
            and lane.draft_start + len(lane.draft_feed) != self.end_position
        ):
            raise ValueError("the draft model catches up to the lane's last fed token")
        if self.prompt_targets and len(self.prompt_targets) != len(self.token_ids):
            raise ValueError(
                f"{len(self.prompt_targets)} prompt targets for {len(self.token_ids)} tokens"
            )
        if self.forced_token is not None and (not self.sample or self.speculation or self.grammar):
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
