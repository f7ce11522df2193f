"""Speculation as a part of one choice and of its decode lanes: draft state, proposals, drafts."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from domain.speculation.drafts import (
    NgramProposer,
    SpeculativeConfig,
    SpeculativeMethod,
    next_draft_limit,
)

if TYPE_CHECKING:  # the engine's scheduler asks this of its sequences: naming them is a cycle
    from domain.engine.sequence import Sequence


@dataclass(frozen=True, slots=True)
class DraftLane:
    """What a speculative lane verifies: `drafts`, its last fed tokens (history proposals), or
    `propose` drafts its executor's draft model proposes after the fed tokens, once that model
    has caught up on `draft_feed` (positions `draft_start ..`, the lane's last fed token
    included). A lane with neither runs a width-one round."""

    drafts: tuple[int, ...] = ()
    propose: int = 0
    draft_feed: tuple[int, ...] = ()
    draft_start: int = 0

    def __post_init__(self) -> None:
        if self.propose < 0 or self.draft_start < 0:
            raise ValueError("proposals and the draft start cannot be negative")
        if self.propose and (self.drafts or not self.draft_feed):
            raise ValueError("a lane proposing drafts has none yet and feeds its draft model")


@dataclass(frozen=True, slots=True)
class Proposal:
    """What speculation adds to one planned decode lane: known drafts, or how many its draft
    model will propose; either takes cache positions and token budget like fed tokens."""

    drafts: tuple[int, ...] = ()
    propose: int = 0

    @property
    def room(self) -> int:
        return len(self.drafts) + self.propose


class ChoiceSpeculation:
    """One choice's speculation state: its n-gram proposer (built at its first proposal, then
    extended with every kept output token), the drafts to offer next (`draft_limit`, 0: k,
    adapted to how many recently stood) and, with a draft model, how many positions that model's
    cache holds (`draft_computed`, kept in step with acceptance; zero after a preemption, which
    frees the blocks both caches use)."""

    def __init__(self, config: SpeculativeConfig) -> None:
        self._config = config
        self._proposer: NgramProposer | None = None
        self.draft_limit = 0
        self.draft_computed = 0

    @property
    def draft_model(self) -> bool:
        return self._config.method is SpeculativeMethod.DRAFT_MODEL

    def propose(self, history: Callable[[], tuple[int, ...]], cap: int) -> Proposal:
        """Up to k drafts (fewer after rejections, see `next_draft_limit`) and at most `cap`;
        `history` (prompt and outputs) seeds the proposer on its first use."""
        k = self._config.num_speculative_tokens
        limit = min(k, self.draft_limit or k, cap)
        if limit < 1:
            return Proposal()
        if self.draft_model:
            return Proposal(propose=limit)
        if self._proposer is None:
            config = self._config
            self._proposer = NgramProposer(
                config.prompt_lookup_min, config.prompt_lookup_max, history()
            )
        return Proposal(drafts=self._proposer.propose(limit))

    def lane(
        self, proposal: Proposal, tokens_between: Callable[[int, int], tuple[int, ...]], end: int
    ) -> DraftLane:
        """The lane part of a planned proposal; a proposing lane's draft model first catches
        up from what its cache holds to `end`, the lane's last fed position."""
        if not proposal.propose:
            return DraftLane(drafts=proposal.drafts)
        start = self.draft_computed
        return DraftLane(
            propose=proposal.propose, draft_feed=tokens_between(start, end), draft_start=start
        )

    def observe(self, tokens: Iterable[int]) -> None:
        """Kept output tokens join the proposer's history."""
        if self._proposer is not None:
            self._proposer.extend(tokens)

    def verified(self, offered: int, accepted: int, first_position: int) -> None:
        """A round that offered drafts kept the first `accepted` of them."""
        if not offered:
            return
        if self.draft_model:
            # The draft model fed the lane's last token and every draft but the last.
            self.draft_computed = first_position + min(accepted, offered - 1)
        self.draft_limit = next_draft_limit(self.draft_limit, offered, accepted)

    def preempted(self) -> None:
        self.draft_computed = 0


def lane_proposal(sequence: Sequence, chunk: int, budget: int) -> Proposal | None:
    """What speculation adds to a decode lane: drafts within the token budget and one short of
    the remaining output budget (a round also emits the target's own token). None before
    `min_tokens` are out, whose bans a width-one round applies, and none while a grammar waits
    for the reasoning's end: a draft past it would emit answer tokens the grammar never saw."""
    speculation = sequence.speculation
    decoding = chunk == 1 and sequence.cache.num_computed + 1 == sequence.num_tokens
    if speculation is None or not decoding or sequence.awaits_grammar:
        return None
    if len(sequence.outputs) < sequence.sampling.params.min_tokens:
        return None
    cap = min(sequence.remaining - 1, budget - 1)
    if sequence.budget is not None:
        # No round runs past a token the thinking budget forces; a lane with a forced token
        # pending does not speculate at all (room 0).
        cap = min(cap, sequence.budget.room - 1)
    return speculation.propose(lambda: sequence.prompt + tuple(sequence.outputs), cap)
