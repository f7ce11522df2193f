"""One choice's place in the KV cache: its slot and epoch, its blocks and what they hold."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from domain.cache.pool import BlockPool, PrefixChain


@dataclass(eq=False)
class CachePlacement:
    """Where a running choice lives: its slot and the epoch it got it in, its KV blocks, how
    many positions they hold (`num_computed`) and, oldest first, the chunks of its submissions
    in flight, each with whether that lane samples a token (two at most: an overlapped loop
    plans a step before the one in flight is read). `prefix` digests its full blocks for the
    prefix cache (kept across preemptions: the tokens do not change), and `published` counts
    its leading blocks the cache already knows."""

    slot: int | None = None
    epoch: int = 0
    blocks: list[int] = field(default_factory=list)
    num_computed: int = 0
    in_flight: list[tuple[int, bool]] = field(default_factory=list)
    prefix: PrefixChain = field(default_factory=PrefixChain)
    published: int = 0
    cached_tokens: int | None = None  # prompt tokens its first admission read from the cache
    # Leading blocks given back while running (outside every layer's window): their entries
    # stay in `blocks`, which maps positions, but this placement no longer holds them.
    dropped: int = 0

    @property
    def num_fed(self) -> int:
        """Positions the cache holds once the submissions in flight have run."""
        return self.num_computed + sum(chunk for chunk, _ in self.in_flight)

    @property
    def pending(self) -> int:
        """Tokens the submissions in flight sample that the host has not read yet."""
        return sum(samples for _, samples in self.in_flight)

    def publish(
        self, pool: BlockPool, tokens_between: Callable[[int, int], tuple[int, ...]], known: int
    ) -> None:
        """Publishes the blocks full of positions computed whose tokens are known (the first
        `known` of the stream): a placeholder's token is known once its step commits, a draft
        once accepted, so the cache never holds a guess. Then gives back the blocks the pool's
        sliding window has left behind (`drop_outside`)."""
        count = min(self.num_computed, known) // pool.block_size
        if pool.enabled and count > self.published:
            tokens = tokens_between(0, count * pool.block_size)
            self.published = pool.publish(self.prefix, self.blocks, tokens, self.published)
        self.drop_outside(pool)

    def take(self, pool: BlockPool, hits: list[int], queried: int) -> None:
        """Starts the placement on the cached blocks of its prompt's prefix (`hits`, found by
        a lookup of `queried` tokens), whose positions it never computes."""
        pool.take(hits, queried)
        self.blocks, self.published, self.dropped = list(hits), len(hits), 0
        self.num_computed = len(hits) * pool.block_size
        if self.cached_tokens is None:
            self.cached_tokens = self.num_computed

    def drop_outside(self, pool: BlockPool) -> None:
        """Gives back the leading blocks no query can see any more under the pool's window W
        (every layer attends only to keys at positions > p - W from a query at p).

        Every query still to run (the chunks in flight included) sits at `num_computed` or
        later, so positions below `num_computed - W + 1` are never read again. Their
        entries stay in the block table, where the window's mask hides whatever a later owner
        writes there. With the prefix cache on, only published blocks go: `publish` still
        reads the table from `published` on, and a published block stays findable after.
        """
        if pool.window is None:
            return
        count = max(0, self.num_computed - pool.window + 1) // pool.block_size
        count = min(count, len(self.blocks))
        if pool.enabled:
            count = min(count, self.published)
        if count > self.dropped:
            pool.free(self.blocks[self.dropped : count])
            self.dropped = count

    def release(self, pool: BlockPool) -> None:
        """Gives the blocks back (a cached one stays findable until it is reused) and forgets
        what they held and what was in flight; the digests stay, as the tokens do."""
        pool.free(self.blocks[self.dropped :])
        self.blocks, self.published, self.num_computed, self.in_flight = [], 0, 0, []
        self.dropped = 0

    @classmethod
    def salted(cls, salt: str | None) -> CachePlacement:
        """A placement whose blocks only streams with the same `cache_salt` read."""
        return cls(prefix=PrefixChain(salt))
