"""One generated choice of a request as the scheduler sees it: identity, progress and parts."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from domain.cache.placement import CachePlacement
from domain.logprobs.scoring import PromptScoring
from domain.overlap.pending import PENDING_TOKEN
from domain.reasoning.thinking import ThinkingTracker
from domain.requests.choice_sampling import ChoiceSampling
from domain.speculation.choice import ChoiceSpeculation
from domain.structured.constraint import OutputConstraint


class SequenceState(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """Mutable progress of one choice; only the scheduler and the engine change it.

    `sampling` holds what admission fixed for the choice (seed, stop tokens, bans, budget) and
    `cache` its placement; a preempted sequence drops the placement and later re-prefills
    prompt plus outputs. Each feature keeps its state in one optional part of its own package:
    `speculation`, `thinking` (the budget's tracker over prompt and outputs, so a preempted
    choice resumes it after re-prefill), `constraint` (the output grammar) and `scoring` (the
    prompt's scores).
    """

    request_id: str
    index: int
    prompt: tuple[int, ...]
    sampling: ChoiceSampling
    outputs: list[int] = field(default_factory=list)
    state: SequenceState = SequenceState.WAITING
    cache: CachePlacement = field(default_factory=CachePlacement)
    num_preemptions: int = 0
    speculation: ChoiceSpeculation | None = None
    thinking: ThinkingTracker | None = None
    constraint: OutputConstraint | None = None
    scoring: PromptScoring | None = None

    @property
    def answer_offset(self) -> int | None:
        """Where the answer begins within the output: at once without a thinking budget, after
        the reasoning's end with one (None while it is open)."""
        return 0 if self.thinking is None else self.thinking.answer_offset

    @property
    def awaits_grammar(self) -> bool:
        """The choice has a grammar that starts after reasoning still going on."""
        return self.constraint is not None and self.answer_offset is None

    @property
    def budget(self) -> ThinkingTracker | None:
        """The thinking budget's tracker while it applies: it may force the reasoning's end
        (`forced_next`) and bounds what a round emits (`room`); not once a grammar has started,
        which owns every later token."""
        if self.constraint is not None and self.answer_offset is not None:
            return None
        return self.thinking

    @property
    def needs_scoring(self) -> bool:
        return self.scoring is not None and self.scoring.pending

    @property
    def prefill_done(self) -> bool:
        return self.cache.num_computed >= self.num_tokens

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.outputs)

    @property
    def remaining(self) -> int:
        """Tokens this choice may still emit."""
        return self.sampling.max_tokens - len(self.outputs)

    def tokens_between(self, start: int, end: int) -> tuple[int, ...]:
        """Positions past the outputs hold tokens in flight, unknown here (`PENDING_TOKEN`)."""
        prompt_len, known = len(self.prompt), min(end, self.num_tokens)
        pending = (PENDING_TOKEN,) * (end - known)
        if known <= prompt_len:
            return self.prompt[start:known] + pending
        if start >= prompt_len:
            return tuple(self.outputs[start - prompt_len : known - prompt_len]) + pending
        return self.prompt[start:] + tuple(self.outputs[: known - prompt_len]) + pending
