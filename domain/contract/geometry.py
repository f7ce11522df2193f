"""The fixed geometry a loaded executor declares; the engine plans its steps within it."""

from __future__ import annotations

from dataclasses import dataclass


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
