"""One choice's place in the KV cache: its slot and epoch, its blocks and what they hold."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(eq=False)
class CachePlacement:
    """Where a running choice lives: its slot and the epoch it got it in, its KV blocks, how
    many positions they hold (`num_computed`) and how many the step in flight feeds."""

    slot: int | None = None
    epoch: int = 0
    blocks: list[int] = field(default_factory=list)
    num_computed: int = 0
    in_flight: int = 0
