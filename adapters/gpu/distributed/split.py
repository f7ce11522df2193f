"""How one decoder is cut across tensor-parallel ranks: heads, MLP columns and vocabulary lanes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from adapters.gpu.distributed.shards import shard_range
from adapters.gpu.model.config import ModelConfig


class SplitError(ValueError):
    """The model cannot be split over the requested number of ranks."""


def _even(total: int, parts: int, index: int) -> tuple[int, int]:
    """[start, stop) of part `index` when `total` items split as evenly as possible."""
    base, extra = divmod(total, parts)
    start = index * base + min(index, extra)
    return start, start + base + (index < extra)


@dataclass(frozen=True, slots=True)
class RankSplit:
    """What rank `rank` of `world_size` holds, as global [start, stop) ranges.

    Query heads come with their key/value head's group; when there are fewer key/value heads
    than ranks, each one is replicated on world_size / kv_heads ranks that split its queries.
    The MLP's inner columns split as evenly as possible; the vocabulary splits into whole
    normalizer tiles (`shard_range`), the embedding and the LM head alike.
    """

    rank: int
    world_size: int
    query_heads: tuple[int, int]
    kv_heads: tuple[int, int]
    inner: tuple[int, int]
    vocab: tuple[int, int]

    @property
    def whole(self) -> bool:
        """One rank holds everything: the single-device decoder, with no collectives."""
        return self.world_size == 1

    def local_config(self, config: ModelConfig) -> ModelConfig:
        """The shapes this rank's layers hold (its heads and columns; the vocabulary stays)."""
        return dataclasses.replace(
            config,
            num_attention_heads=self.query_heads[1] - self.query_heads[0],
            num_key_value_heads=self.kv_heads[1] - self.kv_heads[0],
            intermediate_size=self.inner[1] - self.inner[0],
        )


def split_model(config: ModelConfig, world_size: int, vocab_size: int) -> tuple[RankSplit, ...]:
    """Every rank's split of `config` over `world_size` ranks, `vocab_size` real tokens.

    Raises SplitError where no split exists: more ranks than query heads or MLP columns, or key/
    value heads that neither cover the ranks nor replicate evenly over them.
    """
    if world_size < 1:
        raise SplitError(f"the tensor-parallel size must be positive, got {world_size}")
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    groups = config.num_query_groups
    if world_size > heads:
        raise SplitError(
            f"{heads} attention heads cannot be split over {world_size} ranks; use at most {heads}"
        )
    if world_size > config.intermediate_size:
        raise SplitError(f"{config.intermediate_size} MLP columns cannot cover {world_size} ranks")
    experts = config.experts
    if experts is not None and world_size > experts.inner:
        raise SplitError(
            f"{experts.inner} columns per expert cannot cover {world_size} ranks "
            "(experts split by shard: every rank holds a slice of every expert)"
        )
    replicas = 1
    if kv_heads < world_size:
        replicas = world_size // kv_heads
        if world_size % kv_heads or groups % replicas:
            raise SplitError(
                f"{kv_heads} key/value heads (each serving {groups} query heads) cannot be "
                f"replicated evenly over {world_size} ranks; use a tensor-parallel size that "
                f"divides or is a multiple of {kv_heads} and whose replicas split the "
                f"{groups} query heads of a group"
            )
    splits = []
    for rank in range(world_size):
        if replicas > 1:
            kv = rank // replicas
            share = groups // replicas
            first = kv * groups + (rank % replicas) * share
            query, key_value = (first, first + share), (kv, kv + 1)
        else:
            key_value = _even(kv_heads, world_size, rank)
            query = (key_value[0] * groups, key_value[1] * groups)
        splits.append(
            RankSplit(
                rank=rank,
                world_size=world_size,
                query_heads=query,
                kv_heads=key_value,
                inner=_even(config.intermediate_size, world_size, rank),
                vocab=shard_range(vocab_size, world_size, rank),
            )
        )
    return tuple(splits)
