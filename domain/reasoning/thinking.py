"""The thinking budget: when a reasoning block has used its tokens, its end is forced."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from domain.common.ranges import INT32_MAX, IntRange

# vLLM's `thinking_token_budget`: how many tokens a reasoning block may hold.
THINKING_BUDGET = IntRange(0, INT32_MAX)


@dataclass(frozen=True, slots=True)
class ThinkingMarkers:
    """The token IDs of the reasoning start and end strings, each tokenized once."""

    start: tuple[int, ...]
    end: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.start or not self.end or self.start == self.end:
            raise ValueError("the reasoning start and end must be different, non-empty tokens")


@dataclass(frozen=True, slots=True)
class ThinkingBudget:
    """A request's reasoning blocks between the start and end markers, and their budget.

    `budget` caps the reasoning tokens per block; None tracks the blocks without a cap (a
    grammar waiting for the reasoning to end needs to know where it ends). `opened` is the
    reasoning parser's reading of the prompt: True when the output begins inside a block
    (`deepseek_r1` always, `qwen3` when the templated prompt opened one), False when it begins
    in the answer, None on a server without a parser, where the blocks are found from the
    tokens alone and a grammar constrains the whole output.
    """

    budget: int | None
    markers: ThinkingMarkers
    opened: bool | None = None

    def __post_init__(self) -> None:
        if self.budget is not None:
            THINKING_BUDGET.check(self.budget, "thinking_token_budget")

    def tracker(self, prompt: Iterable[int]) -> ThinkingTracker:
        return ThinkingTracker(self, tuple(prompt))


class ThinkingTracker:
    """One choice's reasoning state over its tokens, as vLLM's budget processor counts them.

    A block opens when the token stream (prompt included, so a chat template that ends with the
    start string opens one) ends with the start tokens, and closes when it ends with the end
    tokens; the tokens after the start's last one count, the markers do not. When an open block
    holds `budget` tokens the end tokens are forced, one per emitted token, then the block is
    closed and the answer goes on; a later start opens a new block with a fresh count. A block
    the model closes itself before the budget forces nothing.

    Every token after the start counts as it arrives, the first tokens of an end string
    included (they are reasoning until the string completes). When the budget is reached while
    the block ends with such a prefix, forcing continues with the end's next token, so the
    end string appears once (never `E1 E1 E2`).

    With a reasoning parser's reading (`ThinkingBudget.opened`), an output the parser reads as
    beginning inside a block is open from its first token, and `answer_offset` says where the
    answer a grammar constrains begins: after the end that closes that first block.

    The state is a function of the tokens seen, kept with the choice (not its slot), so a
    preempted choice resumes with it after re-prefill.
    """

    def __init__(self, budget: ThinkingBudget, prompt: tuple[int, ...]) -> None:
        self._budget = budget.budget
        self._start = budget.markers.start
        self._end = budget.markers.end
        self._recent: deque[int] = deque(maxlen=max(len(self._start), len(self._end)))
        self._open = False
        self._count = 0
        # Index into the end tokens of the next forced one; None while nothing is forced.
        self._forcing: int | None = None
        self._seen = 0
        start_at = _last_index(prompt, self._start)
        prompt_opened = start_at > _last_index(prompt, self._end)
        if prompt_opened:
            self._open = True
            self._count = len(prompt) - start_at - len(self._start)
        if budget.opened is not None:
            # The parser's reading decides; a block it reads as open without a start string in
            # the prompt's tokens counts from the first output token.
            self._open = budget.opened
            self._count = self._count if prompt_opened else 0
        # Output tokens before the answer: 0 unless the parser reads the output as beginning in
        # reasoning, then unknown (None) until the end that closes that block.
        self._answer_offset: int | None = None if budget.opened else 0
        self._recent.extend(prompt)
        self._check_budget()

    @property
    def forced_next(self) -> int | None:
        """The token the choice must emit next, or None when it samples."""
        return None if self._forcing is None else self._end[self._forcing]

    @property
    def in_reasoning(self) -> bool:
        return self._open

    @property
    def answer_offset(self) -> int | None:
        """How many output tokens precede the answer (where a grammar starts): 0 unless the
        output began inside a block, then the tokens up to and including the end that closed
        it, whether emitted or forced; None while that first block is open."""
        return self._answer_offset

    @property
    def room(self) -> int:
        """Tokens the choice may emit in one round (drafts plus one) without passing a point
        where a token must be forced: 0 while forcing; in a block, what its budget has left;
        outside one, the budget plus one, since the very next token may complete a start."""
        if self._forcing is not None:
            return 0
        if self._budget is None:
            return INT32_MAX
        if self._open:
            return self._budget - self._count
        return self._budget + 1

    def observe(self, tokens: Iterable[int]) -> None:
        """Advances over emitted tokens, in order."""
        for token_id in tokens:
            self._observe(token_id)

    def _observe(self, token_id: int) -> None:
        self._recent.append(token_id)
        self._seen += 1
        if self._forcing is not None:
            # Only the expected token advances the forced end; anything else leaves it pending.
            if token_id == self._end[self._forcing]:
                self._forcing += 1
                if self._forcing == len(self._end):
                    self._forcing = None
                    self._close()
            return
        if _ends_with(self._recent, self._start):
            self._open, self._count = True, 0
        elif _ends_with(self._recent, self._end):
            self._close()
        elif self._open:
            self._count += 1
        self._check_budget()

    def _close(self) -> None:
        if self._open and self._answer_offset is None:
            self._answer_offset = self._seen
        self._open, self._count = False, 0

    def _check_budget(self) -> None:
        if self._budget is None or not self._open or self._forcing is not None:
            return
        if self._count >= self._budget:
            # The model may have begun the end itself: forcing goes on from its prefix.
            self._forcing = _end_prefix(self._recent, self._end)


def _ends_with(recent: deque[int], marker: tuple[int, ...]) -> bool:
    if len(recent) < len(marker):
        return False
    return tuple(recent)[len(recent) - len(marker) :] == marker


def _end_prefix(recent: deque[int], end: tuple[int, ...]) -> int:
    """The length of the longest proper prefix of `end` that `recent` ends with."""
    tokens = tuple(recent)
    for length in range(min(len(end) - 1, len(tokens)), 0, -1):
        if tokens[len(tokens) - length :] == end[:length]:
            return length
    return 0


def _last_index(tokens: tuple[int, ...], marker: tuple[int, ...]) -> int:
    """Where `marker` last starts in `tokens`, or -1."""
    for index in range(len(tokens) - len(marker), -1, -1):
        if tokens[index : index + len(marker)] == marker:
            return index
    return -1
