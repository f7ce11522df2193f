"""KV block bookkeeping: which physical blocks are free, and how many a length needs."""

from __future__ import annotations


def blocks_needed(num_positions: int, block_size: int) -> int:
    """Blocks that hold `num_positions` cache positions."""
    return -(-num_positions // block_size)


class BlockAllocator:
    """Hands out physical KV block IDs; freed blocks go back to the front of the pool."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError("num_blocks must be positive")
        self._num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    def allocate(self, count: int) -> list[int]:
        if count > len(self._free):
            raise ValueError(f"asked for {count} blocks, {len(self._free)} free")
        taken = [self._free.pop() for _ in range(count)]
        return taken

    def free(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))
