"""KV block arithmetic: how many blocks a length needs."""

from __future__ import annotations


def blocks_needed(num_positions: int, block_size: int) -> int:
    """Blocks that hold `num_positions` cache positions."""
    return -(-num_positions // block_size)
