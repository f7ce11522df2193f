"""How ranks split a vocabulary: whole normalizer tiles per rank, in rank order."""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from adapters.gpu.logprobs.normalizer import LSE_TILE


def shard_range(vocab_size: int, world_size: int, rank: int) -> tuple[int, int]:
    """The token IDs [start, stop) that `rank` holds: whole LSE_TILE tiles, in rank order.

    The ceil(V / LSE_TILE) tiles are split as evenly as possible, the first ranks taking one
    more tile when they do not divide (3 tiles over 2 ranks: 2 and 1). Every boundary is thus a
    multiple of LSE_TILE except the vocabulary's end, so each shard's tiles are exactly the
    single-rank normalizer's tiles. With fewer tiles than ranks the trailing ranks hold empty
    ranges. Rank 0's range is the widest; a rank's logits tensor may be wider than its range
    (a shard width padded for every rank alike) and lanes past the range never count.
    """
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    if world_size < 1:
        raise ValueError(f"world_size must be positive, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank}")
    base, extra = divmod(-(-vocab_size // LSE_TILE), world_size)
    first_tile = rank * base + min(rank, extra)
    tiles = base + (rank < extra)
    start = min(first_tile * LSE_TILE, vocab_size)
    return start, min((first_tile + tiles) * LSE_TILE, vocab_size)


@dataclass(frozen=True, slots=True)
class VocabShard:
    """One rank's token IDs [start, stop) of a vocabulary split by `shard_range`, with every
    rank's tile count and range stop (rank order is global tile order)."""

    vocab_size: int
    rank: int
    world_size: int
    start: int
    stop: int
    tiles: tuple[int, ...]
    stops: tuple[int, ...]

    @classmethod
    def of(
        cls,
        vocab_size: int,
        rank: int,
        world_size: int,
        max_tiles: int | None = None,
        exchange: str = "",
    ) -> VocabShard:
        """Refuses splits whose widest shard (rank 0's) has more than `max_tiles` tiles, the
        most that `exchange` carries (None: any number)."""
        start, stop = shard_range(vocab_size, world_size, rank)
        ranges = [shard_range(vocab_size, world_size, peer) for peer in range(world_size)]
        tiles = tuple(-(-(last - first) // LSE_TILE) for first, last in ranges)
        if max_tiles is not None and tiles[0] > max_tiles:
            raise ValueError(
                f"a vocabulary of {vocab_size} over {world_size} ranks puts {tiles[0]} tiles of "
                f"{LSE_TILE} lanes on a shard; {exchange} carries at most {max_tiles} "
                f"({max_tiles * LSE_TILE} lanes), so use more ranks"
            )
        stops = tuple(last for _, last in ranges)
        return cls(vocab_size, rank, world_size, start, stop, tiles, stops)

    @property
    def width(self) -> int:
        """Lanes of the vocabulary this rank holds."""
        return self.stop - self.start

    def check_group(self, group: dist.ProcessGroup | None, owner: str) -> None:
        """Raises unless `group` puts this process at the shard's rank of its world size."""
        # A mismatch would pair shards with the wrong ranks' statistics, silently.
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        if (world, rank) != (self.world_size, self.rank):
            raise ValueError(
                f"{owner} is rank {self.rank} of {self.world_size}, "
                f"the group has rank {rank} of {world}"
            )
