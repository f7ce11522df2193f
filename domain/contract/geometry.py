"""The fixed geometry a loaded executor declares; the engine plans its steps within it."""

from __future__ import annotations

from dataclasses import dataclass

from domain.contract.capabilities import NO_LOGPROBS, LogprobCapability


@dataclass(frozen=True, slots=True)
class ExecutorGeometry:
    """Fixed sizes of a loaded executor, and the logprob capability of its core; the scheduler
    plans within them."""

    capacity: int
    block_size: int
    num_blocks: int
    vocab_size: int
    max_model_len: int
    token_capacity: int
    logprobs: LogprobCapability = NO_LOGPROBS
    # W when every layer (of the draft model too) attends only to keys at positions > p - W
    # from a query at p; None when any layer attends to the whole sequence. With W, blocks
    # wholly older than that are never read again and may be freed while a sequence runs.
    kv_window: int | None = None

    def __post_init__(self) -> None:
        sizes = ("capacity", "block_size", "num_blocks", "vocab_size", "max_model_len")
        for name in (*sizes, "token_capacity"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")
        if self.kv_window is not None and self.kv_window < 1:
            raise ValueError(f"kv_window must be positive or None, got {self.kv_window}")
