"""Prompt scoring over a vocabulary split across ranks, joined by two 64-word exchanges per row."""

from __future__ import annotations

import torch

from adapters.gpu.distributed.collectives import Collectives
from adapters.gpu.distributed.shards import VocabShard
from adapters.gpu.logprobs.keys import (
    NAN_BITS,
    NO_KEY,
    greater_counts,
    key_token_ids,
    order_keys,
    top_sort_keys,
)
from adapters.gpu.logprobs.normalizer import combine_tiles, group_tiles, tile_statistics
from adapters.gpu.scoring.prompt_scorer import BlockScorer, pack_prompt_rows
from domain.logprobs.values import NATURAL_TOP_K, NO_TOKEN

EXCHANGE_WORDS = 64

# Exchange 1 words of a row: up to 31 (FP32 maximum, exponential mass) pairs of the shard's
# tiles in tile order, then the raw logit of the row's target where this rank owns it; the last
# word stays reserved (zero). A shard of more than 31 tiles sends runs of tiles as one pair each
# (`run_tiles`).
EXCHANGED_PAIRS = (EXCHANGE_WORDS - 2) // 2
_TARGET_WORD = EXCHANGE_WORDS - 2
# Exchange 2 words of a row: how many shard values are strictly greater than the target's, then
# the shard's best twenty (ID, reported FP32 bits) pairs by sort key; the rest stays zero.
_COUNT_WORD = 0
_PAIR_WORDS = slice(1, 1 + 2 * NATURAL_TOP_K)


def run_tiles(tiles: int) -> int:
    """How many of a shard's `tiles` exchange 1 sends as one pair: 1 while they fit."""
    return max(1, -(-tiles // EXCHANGED_PAIRS))


class VocabParallelPromptScorer(BlockScorer):
    """`PromptScorer` for a vocabulary sharded across ranks (`collectives`), as one rank scores.

    Each rank projects at most PROJECTION_ROWS hidden rows at a time into its own shard lanes
    (`shard_range`, the generation split) and keeps one pooled [PROJECTION_ROWS, shard width]
    block. Per row block, exchange 1 carries the shard's tile statistics and the target's raw
    logit, from which every rank rebuilds the same normalizer; exchange 2 carries the shard's
    strictly-greater count and best twenty pairs, which every rank merges into the complete
    packed rows. Each exchange is one all-gather of EXCHANGE_WORDS int32 words per row per
    rank; logits never travel.

    Exchange 1 carries at most EXCHANGED_PAIRS statistics per rank. Shards of up to that many
    tiles send one pair per tile, and the rows equal the single-rank scorer's word for word;
    wider shards (a 128k-152k vocabulary over two ranks) send each run of `run_tiles` tiles as
    one pair (`group_tiles`), so the normalizer may differ from the single-rank one in its last
    bits, the same on every rank.
    """

    def __init__(
        self,
        vocab_size: int,
        rank: int,
        world_size: int,
        collectives: Collectives | None = None,
    ) -> None:
        self.shard = VocabShard.of(vocab_size, rank, world_size)
        super().__init__(self.shard.width, "shard")
        self._runs = tuple(run_tiles(tiles) for tiles in self.shard.tiles)
        # Pairs each rank sends in exchange 1 (none from an empty shard).
        self._pairs = tuple(-(-t // r) for t, r in zip(self.shard.tiles, self._runs, strict=True))
        self.collectives = collectives or Collectives()
        self._stops = torch.tensor(self.shard.stops, dtype=torch.int64)

    def _who(self) -> str:
        return f"rank {self.shard.rank} "

    def _begin(self, rows: int) -> None:
        # `hidden` and `targets` are replicated, so every rank makes the same exchanges and
        # writes the same rows, those of `PromptScorer.score`.
        if rows:
            self.shard.check_group(self.collectives.group, "scorer")

    def _block_of(self, logits: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """This rank's raw FP32 shard lanes, copied into `pooled`."""
        return pooled.copy_(logits)

    def _rows(self, raw: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The packed rows of one block; `raw` becomes the shard's reported values in place."""
        valid = (targets >= 0) & (targets < self.shard.vocab_size)
        first = self._exchange(self._statistics(raw, targets, valid))
        lse = self._normalizer(first)
        # The same FP32 subtraction as the single-rank block, so the target's bits match it.
        actual = self._owner_word(first, targets) - lse
        values = raw.sub_(lse[:, None])
        second = self._exchange(self._candidates(values, actual))
        greater = second[:, :, _COUNT_WORD].sum(dim=0, dtype=torch.int32)
        pair_ids, pair_bits = self._merged(second)
        bits = actual.view(torch.int32)
        return pack_prompt_rows(valid, targets, bits, greater + 1, pair_ids, pair_bits)

    def _exchange(self, words: torch.Tensor) -> torch.Tensor:
        """[n, 64] int32 words of this rank -> [world, n, 64] of every rank, in rank order."""
        # Gloo takes only the concatenated output form, so ranks are split off afterwards.
        received = words.new_empty(self.shard.world_size * words.shape[0], EXCHANGE_WORDS)
        self.collectives.all_gather_single(received, words, "scoring")
        return received.view(self.shard.world_size, words.shape[0], EXCHANGE_WORDS)

    def _words(self, rows: int, device: torch.device) -> torch.Tensor:
        # Reserved words stay zero so that the exchanged payload is deterministic.
        return torch.zeros(rows, EXCHANGE_WORDS, dtype=torch.int32, device=device)

    def _statistics(
        self, raw: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor
    ) -> torch.Tensor:
        """Exchange 1 payload: the shard's (max, mass) pairs and the owned target's raw logit.

        The shard starts on a tile boundary, so its tiles are the single-rank normalizer's own,
        bit for bit, and a run of them is a pair of the same recipe; an empty shard sends no
        pair. Ranks not owning the target send NaN there.
        """
        words = self._words(raw.shape[0], raw.device)
        if raw.shape[1]:
            peaks, masses = group_tiles(*tile_statistics(raw), self._runs[self.shard.rank])
            pairs = torch.stack([peaks, masses], dim=2).flatten(1).view(torch.int32)
            words[:, : pairs.shape[1]] = pairs
        owns = valid & (targets >= self.shard.start) & (targets < self.shard.stop)
        marker = torch.full_like(targets, NAN_BITS, dtype=torch.int32)
        if raw.shape[1]:
            local = torch.where(owns, targets - self.shard.start, torch.zeros_like(targets))
            owned = raw.gather(1, local[:, None])[:, 0].view(torch.int32)
            marker = torch.where(owns, owned, marker)
        words[:, _TARGET_WORD] = marker
        return words

    def _normalizer(self, gathered: torch.Tensor) -> torch.Tensor:
        """The FP32 log normalizer from every rank's pairs, in global tile order (= rank order)."""
        pairs = [
            gathered[peer, :, : 2 * sent].reshape(gathered.shape[1], sent, 2)
            for peer, sent in enumerate(self._pairs)
        ]
        statistics = torch.cat(pairs, dim=1).contiguous().view(torch.float32)
        return combine_tiles(statistics[:, :, 0], statistics[:, :, 1])

    def _owner_word(self, gathered: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """FP32 target-logit word of each row from the rank owning its target (any rank if none)."""
        # The first rank whose stop lies past the ID; empty ranges never own one.
        stops = self._stops.to(targets.device)
        owner = torch.bucketize(targets.clamp(0, self.shard.vocab_size - 1), stops, right=True)
        row = torch.arange(targets.shape[0], device=targets.device)
        return gathered[owner, row, _TARGET_WORD].view(torch.float32)

    def _candidates(self, values: torch.Tensor, actual: torch.Tensor) -> torch.Tensor:
        """Exchange 2 payload: the strictly-greater count and the shard's best twenty pairs."""
        rows, width = values.shape
        words = self._words(rows, values.device)
        # Equal values (ties made by subtracting lse included) never count as greater.
        words[:, _COUNT_WORD] = greater_counts(values, actual)
        ids = torch.full((rows, NATURAL_TOP_K), NO_TOKEN, device=values.device)
        bits = torch.zeros(rows, NATURAL_TOP_K, dtype=torch.int32, device=values.device)
        best = min(NATURAL_TOP_K, width)
        if best:
            # Keys of shard lanes; shifting every ID by the shard start keeps their order.
            local = key_token_ids(top_sort_keys(values, best))
            ids[:, :best] = local + self.shard.start
            # Bits come from the values themselves, so a reported -0.0 keeps its sign.
            bits[:, :best] = values.gather(1, local).view(torch.int32)
        words[:, _PAIR_WORDS] = torch.stack([ids.to(torch.int32), bits], dim=2).flatten(1)
        return words

    def _merged(self, gathered: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The best twenty (ID, bits) pairs among every rank's candidates; (-1, 0) past them."""
        rows = gathered.shape[1]
        pairs = gathered[:, :, _PAIR_WORDS].reshape(self.shard.world_size, rows, -1, 2)
        pairs = pairs.permute(1, 0, 2, 3).reshape(rows, -1, 2)
        ids, bits = pairs[:, :, 0].to(torch.int64), pairs[:, :, 1].contiguous()
        keys = order_keys(bits.view(torch.float32), ids).masked_fill(ids == NO_TOKEN, NO_KEY)
        top, at = torch.topk(keys, NATURAL_TOP_K, dim=1)
        missing = top == NO_KEY
        top_ids = ids.gather(1, at).masked_fill(missing, NO_TOKEN).to(torch.int32)
        return top_ids, bits.gather(1, at).masked_fill(missing, 0)
