"""The KV block pool with automatic prefix caching: chained block hashes, references, LRU reuse."""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from domain.cache.blocks import blocks_needed

# The hash functions `--prefix-caching-hash-algo` offers: both collision-safe, so a chain of
# equal digests is a chain of equal blocks; each hit is still confirmed by its tokens.
HASH_ALGOS = ("sha256", "blake2b")


@dataclass(frozen=True, slots=True)
class BlockKey:
    """What a full block holds: the digest of the blocks before it, its token IDs and the
    extra keys that scope it (the request's `cache_salt`, on every block so a chain never
    crosses salts)."""

    parent: bytes
    tokens: tuple[int, ...]
    salt: str | None = None

    def digest(self, algo: str) -> bytes:
        hasher = hashlib.new(algo)
        hasher.update(self.parent)
        salt = b"" if self.salt is None else b"s" + self.salt.encode()
        hasher.update(len(salt).to_bytes(4, "little") + salt)
        hasher.update(array("q", self.tokens).tobytes())
        return hasher.digest()


class PrefixChain:
    """One token stream's full-block digests, computed once and extended as blocks fill."""

    def __init__(self, salt: str | None = None) -> None:
        self.salt = salt
        self.keys: list[BlockKey] = []
        self.digests: list[bytes] = []

    def extend(self, tokens: Sequence[int], block_size: int, algo: str, count: int) -> None:
        """Digests the first `count` full blocks of `tokens` (a prefix of the same stream)."""
        while len(self.digests) < count:
            index = len(self.digests)
            block = tuple(tokens[index * block_size : (index + 1) * block_size])
            if len(block) != block_size:
                raise ValueError("only full blocks are digested")
            key = BlockKey(self.digests[-1] if self.digests else b"", block, self.salt)
            self.keys.append(key)
            self.digests.append(key.digest(algo))


class PoolSettings(Protocol):
    """What a pool is built from (the scheduler's config)."""

    @property
    def num_blocks(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def prefix_caching(self) -> str | None: ...
    @property
    def kv_window(self) -> int | None: ...


class BlockPool:
    """Hands out physical KV blocks, counting the readers of each.

    With a hash algorithm (`algo`), full blocks whose tokens are known are published under the
    digest of their chain, and a later stream with the same prefix reads them instead of
    computing them. A block with no reader waits in the free queue, least recently freed first;
    a published one stays findable there until a new block is needed and it is the oldest, so
    the cache lives inside the pool and never grows beyond it. Without `algo` nothing is
    published and the pool is a plain allocator.

    `window` is W when every layer of the model attends only to keys at positions > p - W
    from a query at p: its streams give back blocks outside it as they advance
    (`CachePlacement.drop_outside`); None keeps every block until the stream ends.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        algo: str | None = None,
        window: int | None = None,
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        if algo is not None and algo not in HASH_ALGOS:
            raise ValueError(f"unknown prefix-caching hash algorithm {algo!r}")
        if window is not None and window < 1:
            raise ValueError(f"the attention window must be positive, got {window}")
        self.num_blocks, self.block_size, self.algo = num_blocks, block_size, algo
        self.window = window
        self._refs = [0] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[bytes, int] = {}
        self._keys: dict[int, tuple[bytes, BlockKey]] = {}
        self.queries = 0  # prompt tokens looked up
        self.hits = 0  # of those, tokens found cached

    @classmethod
    def configured(cls, settings: PoolSettings) -> BlockPool:
        return cls(
            settings.num_blocks, settings.block_size, settings.prefix_caching, settings.kv_window
        )

    @property
    def enabled(self) -> bool:
        return self.algo is not None

    @property
    def num_free(self) -> int:
        """Blocks a new allocation may take: free ones and cached ones nobody reads."""
        return len(self._free)

    @property
    def usage(self) -> float:
        """The fraction of blocks some stream reads: cached blocks nobody reads count as free,
        as vLLM's KV usage counts them."""
        return 1 - len(self._free) / self.num_blocks

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    def refs(self, block: int) -> int:
        return self._refs[block]

    def match(self, chain: PrefixChain, prompt: Sequence[int], reads: bool = True) -> list[int]:
        """The cached blocks holding the longest run of full blocks of `prompt` from position
        0, each confirmed by its key (tokens and salt), short of the last prompt token, which
        is always computed so that the first sampled token has its logits; none for a stream
        that does not read the cache (`reads`). Takes no reference."""
        if self.algo is None or not reads:
            return []
        count = (len(prompt) - 1) // self.block_size
        chain.extend(prompt, self.block_size, self.algo, count)
        found: list[int] = []
        for digest, key in zip(chain.digests[:count], chain.keys, strict=False):
            block = self._cached.get(digest)
            if block is None or self._keys[block][1] != key:
                break
            found.append(block)
        return found

    def cost(self, blocks: Sequence[int]) -> int:
        """How many free-queue blocks taking `blocks` would use up."""
        return sum(1 for block in blocks if not self._refs[block])

    def fits(self, positions: int, hits: Sequence[int]) -> bool:
        """Whether the pool can take `hits` and then blocks for `positions` more."""
        return blocks_needed(positions, self.block_size) + self.cost(hits) <= len(self._free)

    def take(self, blocks: Sequence[int], queried: int) -> None:
        """Adds a reader to each of `blocks`, the hits of a lookup of `queried` prompt tokens,
        and counts them."""
        if self.algo is not None:
            self.queries += queried
            self.hits += len(blocks) * self.block_size
        for block in blocks:
            if not self._refs[block]:
                del self._free[block]
            self._refs[block] += 1

    def allocate(self, count: int) -> list[int]:
        """Takes `count` blocks, oldest free first; a cached one taken leaves the cache."""
        if count > len(self._free):
            raise ValueError(f"asked for {count} blocks, {len(self._free)} free")
        taken = []
        for _ in range(count):
            block, _ = self._free.popitem(last=False)
            self._evict(block)
            self._refs[block] = 1
            taken.append(block)
        return taken

    def free(self, blocks: Sequence[int]) -> None:
        """Drops one reader of each block; a block nobody reads joins the free queue, a
        stream's last blocks first, so its shared beginning is evicted last."""
        for block in reversed(blocks):
            if self._refs[block] < 1:
                raise ValueError(f"block {block} is already free")
            self._refs[block] -= 1
            if not self._refs[block]:
                self._free[block] = None

    def publish(
        self, chain: PrefixChain, blocks: Sequence[int], tokens: Sequence[int], start: int
    ) -> int:
        """Publishes the full blocks of `tokens` (every one known and in the cache) from block
        `start` on, `blocks` being the stream's block table; returns how many full blocks the
        stream has now published. A block whose content another block already holds in the
        cache stays private, so every digest names one block."""
        count = min(len(tokens) // self.block_size, len(blocks))
        if self.algo is None or count <= start:
            return max(start, count)
        chain.extend(tokens, self.block_size, self.algo, count)
        for index in range(start, count):
            block, digest = blocks[index], chain.digests[index]
            if block in self._keys or digest in self._cached:
                continue
            self._cached[digest] = block
            self._keys[block] = (digest, chain.keys[index])
        return count

    def _evict(self, block: int) -> None:
        entry = self._keys.pop(block, None)
        if entry is not None:
            del self._cached[entry[0]]
