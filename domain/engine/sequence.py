"""One generated choice of a request as the scheduler sees it: tokens, slot, blocks, progress."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from domain.logprobs.values import LogprobOptions
from domain.reasoning.thinking import ThinkingTracker
from domain.requests.sampling import SamplingParams
from domain.speculation.drafts import NgramProposer
from domain.structured.grammar import GrammarSpec


class SequenceState(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """Mutable progress of one choice; only the scheduler and the engine change it.

    `num_computed` counts tokens whose KV is in the cache; `outputs` are emitted tokens.
    A preempted sequence drops its blocks and slot and later re-prefills prompt plus outputs.
    """

    request_id: str
    index: int
    prompt: tuple[int, ...]
    params: SamplingParams
    seed: int
    max_tokens: int
    stop_token_ids: frozenset[int]
    banned_until_min_tokens: tuple[int, ...]
    arrival: int
    outputs: list[int] = field(default_factory=list)
    state: SequenceState = SequenceState.WAITING
    slot: int | None = None
    epoch: int = 0
    blocks: list[int] = field(default_factory=list)
    num_computed: int = 0
    in_flight: int = 0
    num_preemptions: int = 0
    logprobs: LogprobOptions | None = None
    # The output constraint; the executor walks it over the sequence's tokens from
    # `grammar_start` on (after the reasoning, when the output begins inside it).
    grammar: GrammarSpec | None = None
    # Prompt scoring: whether this choice scores its prompt, and how many prompt rows (row r
    # scores position r + 1) are published; preemption keeps the count, so nothing repeats.
    score_prompt: bool = False
    scored_rows: int = 0
    # History proposals (speculative decoding with ngram), built at the first decode step and
    # extended with every kept output token.
    proposer: NgramProposer | None = None
    # Drafts to offer next round (0: the configured k), adapted to how many recently stood.
    draft_limit: int = 0
    # Draft-model speculation: whether this sequence's drafts come from the executor's draft
    # model, how many it proposes this step, and how many positions its cache holds (kept in
    # step with acceptance; zero after a preemption, which frees the blocks both caches use).
    draft_model: bool = False
    pending_proposals: int = 0
    draft_computed: int = 0
    # The thinking budget's state over prompt and outputs; it lives with the choice, so a
    # preempted choice resumes it after re-prefill.
    thinking: ThinkingTracker | None = None

    @property
    def grammar_start(self) -> int | None:
        """The position of the first token the grammar constrains: the first output token,
        or, when the output begins inside reasoning, the token after the end that closes it
        (None until then). None as well for a choice without a grammar."""
        if self.grammar is None:
            return None
        offset = 0 if self.thinking is None else self.thinking.answer_offset
        return None if offset is None else len(self.prompt) + offset

    @property
    def awaits_grammar(self) -> bool:
        """The choice has a grammar that starts after reasoning still going on."""
        return self.grammar is not None and self.grammar_start is None

    @property
    def forced_token(self) -> int | None:
        """The token the next emission must be (the thinking budget's end), if any; none once
        a grammar has started, which owns every later token."""
        if self.thinking is None or self.grammar_start is not None:
            return None
        return self.thinking.forced_next

    @property
    def thinking_room(self) -> int | None:
        """Tokens one round may emit before the thinking budget forces one (see
        `ThinkingTracker.room`); None when no budget applies."""
        if self.thinking is None or self.grammar_start is not None:
            return None
        return self.thinking.room

    @property
    def needs_scoring(self) -> bool:
        """Prompt rows remain unpublished; such a sequence runs only in scored steps."""
        return self.score_prompt and self.scored_rows < len(self.prompt) - 1

    @property
    def prefill_done(self) -> bool:
        return self.num_computed >= self.num_tokens

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.outputs)

    def tokens_between(self, start: int, end: int) -> tuple[int, ...]:
        prompt_len = len(self.prompt)
        if end <= prompt_len:
            return self.prompt[start:end]
        if start >= prompt_len:
            return tuple(self.outputs[start - prompt_len : end - prompt_len])
        return self.prompt[start:] + tuple(self.outputs[: end - prompt_len])

    @property
    def remaining(self) -> int:
        """Tokens this choice may still emit."""
        return self.max_tokens - len(self.outputs)
