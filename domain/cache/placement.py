"""One choice's place in the KV cache: its slot and epoch, its blocks and what they hold."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(eq=False)
class CachePlacement:
    """Where a running choice lives: its slot and the epoch it got it in, its KV blocks, how
    many positions they hold (`num_computed`) and, oldest first, the chunks of its submissions
    in flight, each with whether that lane samples a token (two at most: an overlapped loop
    plans a step before the one in flight is read)."""

    slot: int | None = None
    epoch: int = 0
    blocks: list[int] = field(default_factory=list)
    num_computed: int = 0
    in_flight: list[tuple[int, bool]] = field(default_factory=list)

    @property
    def num_fed(self) -> int:
        """Positions the cache holds once the submissions in flight have run."""
        return self.num_computed + sum(chunk for chunk, _ in self.in_flight)

    @property
    def pending(self) -> int:
        """Tokens the submissions in flight sample that the host has not read yet."""
        return sum(samples for _, samples in self.in_flight)
