"""The logprob capability a core serves, and the rules that keep it within the contract."""

from __future__ import annotations

from dataclasses import dataclass

from domain.contract.buffers import (
    COMPLETION_LOGPROBS,
    GENERATION_GROUPS,
    BufferGroup,
    ContractBuffer,
    Extent,
    buffers_in,
)
from domain.logprobs.rules import LogprobLimits
from domain.logprobs.values import FULL_POSITION_WORDS, NATURAL_TOP_K

# The smallest scored graph, and the factor between neighbouring capacities below the limit.
FIRST_SCORED_CAPACITY = 128
SCORED_CAPACITY_GROWTH = 4


def scored_capacities(chunk_limit: int) -> tuple[int, ...]:
    """Row capacities of the scored prefill graphs for a prefill chunk limit, ascending.

    They start at 128 and grow fourfold while below the limit, which always ends the ladder:
    512 -> (128, 512), 1000 -> (128, 512, 1000), 100 -> (100,).
    """
    if isinstance(chunk_limit, bool) or not isinstance(chunk_limit, int) or chunk_limit < 1:
        raise ValueError(f"the prompt chunk limit must be a positive integer, got {chunk_limit!r}")
    ladder = []
    capacity = FIRST_SCORED_CAPACITY
    while capacity < chunk_limit:
        ladder.append(capacity)
        capacity *= SCORED_CAPACITY_GROWTH
    ladder.append(chunk_limit)
    return tuple(ladder)


def natural_top_k_problem(top_k: int) -> str | None:
    """A core with logprobs reports 1 <= K <= 20 natural alternatives; None when `top_k` does."""
    if 1 <= top_k <= NATURAL_TOP_K:
        return None
    return f"natural cores need 1 <= top_k <= {NATURAL_TOP_K}, got {top_k}"


def selected_ids_problem(top_k: int) -> str | None:
    """A core that selects token IDs (a full core) has K = 20; None when `top_k` is that."""
    if top_k == NATURAL_TOP_K:
        return None
    return f"full cores provide K={NATURAL_TOP_K} natural alternatives, not {top_k}"


def scoring_problem(top_k: int) -> str | None:
    """Prompt scoring requires K = 20 generation logprob outputs; None when `top_k` is that."""
    if top_k == NATURAL_TOP_K:
        return None
    return (
        f"prompt scoring requires K={NATURAL_TOP_K} generation logprob outputs "
        f"({COMPLETION_LOGPROBS} with last extent {2 + 2 * NATURAL_TOP_K}, or the full bundle), "
        f"got {f'K={top_k}' if top_k else 'none'}"
    )


def ladder_problem(capacities: tuple[int, ...]) -> str | None:
    """Scored capacities are the ladder of their largest; None when `capacities` are."""
    if any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in capacities):
        return f"scored capacities must be positive integers, got {capacities}"
    ladder = scored_capacities(max(capacities))
    if capacities != ladder:
        return f"scored capacities must be the ladder {ladder} of their largest, got {capacities}"
    return None


@dataclass(frozen=True, slots=True)
class LogprobCapability:
    """What a core's logprob declarations allow.

    `top_k` natural alternatives per position (0: the core reports no logprobs), whether
    requests may select token IDs instead (only full cores, which also have K=20), and the
    row capacities of its scored prefill graphs (empty: the core does not score prompts;
    otherwise the ladder of its largest, C, and K must be 20).
    """

    top_k: int
    selects_ids: bool
    scored_capacities: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        capacities = tuple(self.scored_capacities)
        object.__setattr__(self, "scored_capacities", capacities)
        if self.selects_ids:
            problem = selected_ids_problem(self.top_k)
        else:
            problem = natural_top_k_problem(self.top_k) if self.top_k else None
        if capacities and not problem:
            problem = ladder_problem(capacities) or scoring_problem(self.top_k)
        if problem:
            raise ValueError(problem)

    @property
    def enabled(self) -> bool:
        return self.top_k > 0

    @property
    def scores_prompts(self) -> bool:
        return bool(self.scored_capacities)

    @property
    def scored_rows(self) -> int:
        """C, the largest scored capacity (the prompt chunk limit); 0 without scoring."""
        return self.scored_capacities[-1] if self.scored_capacities else 0

    def limits(self, max_logprobs: int, vocab_size: int) -> LogprobLimits:
        """What requests may ask of a core with this capability, under `--max-logprobs`."""
        return LogprobLimits(
            top_k=self.top_k,
            selects_ids=self.selects_ids,
            scores_prompts=self.scores_prompts,
            max_logprobs=max_logprobs,
            vocab_size=vocab_size,
        )

    @property
    def position_words(self) -> int:
        """Last extent of completion_logprobs: 0 without logprobs, 258 with selected IDs."""
        if self.selects_ids:
            return FULL_POSITION_WORDS
        return 2 + 2 * self.top_k if self.enabled else 0

    @property
    def generation_groups(self) -> tuple[BufferGroup, ...]:
        """The groups of its generation outputs: the records, then what its K allows."""
        allowed = (True, self.enabled, self.selects_ids)
        return tuple(group for group, ok in zip(GENERATION_GROUPS, allowed, strict=True) if ok)

    @property
    def groups(self) -> tuple[BufferGroup, ...]:
        """The buffer groups a core with this capability declares, in table order."""
        scoring = (BufferGroup.PROMPT_SCORING,) if self.scores_prompts else ()
        return (*self.generation_groups, *scoring)

    @property
    def buffers(self) -> tuple[ContractBuffer, ...]:
        """The contract buffers a core with this capability declares, in table order."""
        return buffers_in(*self.groups)

    def form(
        self, buffer: ContractBuffer, capacity: int, token_capacity: int
    ) -> tuple[str, tuple[Extent, ...]]:
        """`buffer`'s (dtype, shape) in such a core: this K's packed extent, this C's rows."""
        dtype, shape = buffer.form(capacity, token_capacity, self.scored_rows)
        if buffer.name == COMPLETION_LOGPROBS:
            shape = (*shape[:-1], self.position_words)
        return dtype, shape


NO_LOGPROBS = LogprobCapability(top_k=0, selects_ids=False)
FULL_LOGPROBS = LogprobCapability(top_k=NATURAL_TOP_K, selects_ids=True)
