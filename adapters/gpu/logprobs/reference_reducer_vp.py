"""Vocabulary-sharded generation logprobs: per-rank shard work joined by two compact exchanges."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from adapters.gpu.distributed.collectives import Collectives
from adapters.gpu.distributed.shards import VocabShard
from adapters.gpu.logprobs.keys import CANDIDATES_PER_TILE, NO_KEY, key_token_ids, order_keys
from adapters.gpu.logprobs.normalizer import combine_tiles, tile_statistics
from adapters.gpu.logprobs.reducer import ReductionInputs, check_inputs, check_sizes
from adapters.gpu.logprobs.reference_reducer import write_positions
from domain.logprobs.values import MAX_SELECTED_IDS, NO_TOKEN

EXCHANGE_WORDS = 256

# Exchange 1 words of a position: one (FP32 maximum, exponential mass) pair per tile of the
# shard, in tile order. The last pair of the 256 words stays reserved (zero), which bounds a
# shard at 127 tiles.
MAX_SHARD_TILES = EXCHANGE_WORDS // 2 - 1
# Exchange 2 words of a position. A natural row carries its 32 best int64 keys as 64 words, then
# the 32 reported FP32 values; a selecting row carries the 128 selected raw logits instead.
KEY_WORDS = slice(0, 2 * CANDIDATES_PER_TILE)
VALUE_WORDS = slice(2 * CANDIDATES_PER_TILE, 3 * CANDIDATES_PER_TILE)
SELECTED_WORDS = slice(0, MAX_SELECTED_IDS)
CHOSEN_WORD = MAX_SELECTED_IDS


@dataclass(frozen=True)
class _Selection:
    """Which requesting rows select IDs; their [rows, 128] IDs and which of those lie in the
    slot's uploaded prefix, both None when no row can select."""

    selects: torch.Tensor
    ids: torch.Tensor | None = None
    in_prefix: torch.Tensor | None = None


class ShardedReducer:
    """What both vocabulary-parallel reducers hold: checked sizes, this rank's shard of whole
    tiles (at most MAX_SHARD_TILES, checked here) and the collectives that join the ranks."""

    def __init__(
        self,
        vocab_size: int,
        top_k: int,
        rank: int,
        world_size: int,
        collectives: Collectives | None = None,
    ) -> None:
        check_sizes(vocab_size, top_k)
        self.shard = VocabShard.of(vocab_size, rank, world_size, MAX_SHARD_TILES, "exchange 1")
        self.top_k = top_k
        self.collectives = collectives or Collectives()

    def _check(self, inputs: ReductionInputs) -> None:
        """Raises unless `inputs` fit this rank: logits at least as wide as its shard."""
        check_inputs(inputs, self.shard.width, self.top_k, rows=f"rank {self.shard.rank} logits")


class VocabParallelLogprobReducer(ShardedReducer):
    """The reference reduction for logits split by vocabulary across the ranks of `collectives`.

    Each rank passes its own shard and the same replicated row inputs (slots, positions, chosen,
    flags, counts, IDs). The stages mirror the prepared kernels: per-tile maxima and masses,
    exchange 1, the global normalization, shard candidates and owned raw logits, exchange 2, and
    a final merge that writes the packed output of `ReferenceLogprobReducer`, bit for bit, on
    every rank. Shards hold at most MAX_SHARD_TILES tiles, checked on construction. Each
    exchange is one all-gather of EXCHANGE_WORDS FP32 words per requesting position per rank;
    logits never travel.
    """

    def reserve(self, capacity: int, device: torch.device | str) -> None:
        """Nothing to size: every call allocates what its requesting rows need."""

    def reduce(self, inputs: ReductionInputs) -> None:
        """Writes each requesting row's chosen pair and alternative pairs to out[slot, position].

        `inputs.logits` [R, >= shard width] holds this rank's raw logits, only read. Semantics
        match `ReferenceLogprobReducer.reduce`. Flags are replicated, so every rank finds the same
        requesting rows: with none, every rank returns before either exchange.
        """
        shard = self.shard
        self._check(inputs)
        logits_shard, slots, positions, chosen, requested, counts, token_ids, out = inputs
        wanted = requested.index_select(0, slots) != 0
        rows = torch.nonzero(wanted).squeeze(1)
        if rows.numel() == 0:
            return
        shard.check_group(self.collectives.group, "reducer")
        slots, positions = slots.index_select(0, rows), positions.index_select(0, rows)
        chosen = chosen.index_select(0, rows).to(torch.int64)
        raw = logits_shard[:, : shard.width].index_select(0, rows).to(torch.float32)

        lse = self._normalizer(self._exchange(self._shard_statistics(raw)))
        selection = self._selection(slots, counts, token_ids, rows.numel())
        gathered = self._exchange(self._candidates(raw, lse, chosen, selection))
        self._merge(gathered, lse, slots, positions, chosen, selection, out)

    def _exchange(self, words: torch.Tensor) -> torch.Tensor:
        """[n, 256] int32 words of this rank -> [world, n, 256] of every rank, in rank order.

        The words travel as FP32 through one all-gather; only copies touch them, so any bit
        pattern (bit-cast keys included) arrives unchanged.
        """
        sent = words.view(torch.float32)
        received = [torch.empty_like(sent) for _ in range(self.shard.world_size)]
        self.collectives.all_gather_into(received, sent, "logprobs")
        return torch.stack(received).view(torch.int32)

    def _words(self, rows: int, device: torch.device) -> torch.Tensor:
        # Reserved words stay zero so that the exchanged payload is deterministic.
        return torch.zeros(rows, EXCHANGE_WORDS, dtype=torch.int32, device=device)

    def _shard_statistics(self, raw: torch.Tensor) -> torch.Tensor:
        """Exchange 1 payload: the (FP32 maximum, exponential mass) pair of each shard tile.

        The shard starts on a tile boundary, so these are the single-rank normalizer's own
        tiles, bit for bit; an empty shard sends no pair.
        """
        words = self._words(raw.shape[0], raw.device)
        if raw.shape[1]:
            peaks, masses = tile_statistics(raw)
            pairs = torch.stack([peaks, masses], dim=2).flatten(1).view(torch.int32)
            words[:, : pairs.shape[1]] = pairs
        return words

    def _normalizer(self, gathered: torch.Tensor) -> torch.Tensor:
        """The global FP32 log normalizer from every rank's tiles in global tile order.

        Rank order is tile order, so this repeats the single-rank recipe operation for operation
        and every rank gets the reference's bits.
        """
        pairs = [
            gathered[peer, :, : 2 * tiles].reshape(gathered.shape[1], tiles, 2)
            for peer, tiles in enumerate(self.shard.tiles)
        ]
        statistics = torch.cat(pairs, dim=1).contiguous().view(torch.float32)
        return combine_tiles(statistics[:, :, 0], statistics[:, :, 1])

    def _selection(
        self,
        slots: torch.Tensor,
        counts: torch.Tensor | None,
        token_ids: torch.Tensor | None,
        rows: int,
    ) -> _Selection:
        """Which rows select IDs, their [rows, 128] IDs and which of those are in the prefix."""
        if counts is None or token_ids is None:
            return _Selection(torch.zeros(rows, dtype=torch.bool, device=slots.device))
        count = counts.index_select(0, slots).to(torch.int64).clamp(max=MAX_SELECTED_IDS)
        index = torch.arange(MAX_SELECTED_IDS, device=slots.device)
        # IDs past a slot's uploaded prefix are stale and are never used as read indices.
        in_prefix = index[None, :] < count[:, None]
        return _Selection(count > 0, token_ids.index_select(0, slots).to(torch.int64), in_prefix)

    def _candidates(
        self,
        raw: torch.Tensor,
        lse: torch.Tensor,
        chosen: torch.Tensor,
        selection: _Selection,
    ) -> torch.Tensor:
        """Exchange 2 payload: owned raw logits of the chosen and selected IDs, shard top keys."""
        words = self._words(raw.shape[0], raw.device)
        keys, bits = self._shard_best(raw.sub(lse[:, None]))
        words[:, KEY_WORDS] = keys.view(torch.int32)
        words[:, VALUE_WORDS] = bits
        words[:, CHOSEN_WORD] = self._owned(raw, chosen[:, None], None)[:, 0]
        if selection.ids is not None:
            owned = self._owned(raw, selection.ids, selection.in_prefix)
            words[:, SELECTED_WORDS] = torch.where(
                selection.selects[:, None], owned, words[:, SELECTED_WORDS]
            )
        return words

    def _shard_best(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The shard's 32 largest sort keys and their reported FP32 bits, padded with no-keys."""
        rows, width = values.shape
        best = min(CANDIDATES_PER_TILE, width)
        keys = torch.full((rows, CANDIDATES_PER_TILE), NO_KEY, device=values.device)
        bits = torch.zeros(rows, CANDIDATES_PER_TILE, dtype=torch.int32, device=values.device)
        if best:
            ids = torch.arange(
                self.shard.start, self.shard.stop, dtype=torch.int64, device=values.device
            )
            top = torch.topk(order_keys(values, ids), best, dim=1).values
            local = key_token_ids(top) - self.shard.start
            keys[:, :best] = top
            # Bits come from the values themselves, so a reported -0.0 keeps its sign.
            bits[:, :best] = values.gather(1, local).view(torch.int32)
        return keys, bits

    def _owned(
        self, raw: torch.Tensor, ids: torch.Tensor, wanted: torch.Tensor | None
    ) -> torch.Tensor:
        """int32 bits of the raw logit of each ID this rank owns; a NaN marker for the rest."""
        owns = (ids >= self.shard.start) & (ids < self.shard.stop)
        if wanted is not None:
            owns &= wanted
        marker = torch.full(ids.shape, float("nan"), device=raw.device)
        if raw.shape[1] == 0:
            return marker.view(torch.int32)
        safe = torch.where(owns, ids - self.shard.start, torch.zeros_like(ids))
        return torch.where(owns, raw.gather(1, safe), marker).view(torch.int32)

    def _owner_words(self, gathered: torch.Tensor, ids: torch.Tensor, word: int) -> torch.Tensor:
        """FP32 words [rows, columns] from the rank owning each ID, columns starting at `word`."""
        # The first rank whose stop lies past the ID; empty ranges never own one.
        stops = torch.tensor(self.shard.stops, dtype=torch.int64, device=ids.device)
        owner = torch.bucketize(ids.clamp(0, self.shard.vocab_size - 1), stops, right=True)
        row = torch.arange(ids.shape[0], device=ids.device)[:, None]
        column = word + torch.arange(ids.shape[1], device=ids.device)[None, :]
        return gathered[owner, row, column].view(torch.float32)

    def _reported(
        self, gathered: torch.Tensor, lse: torch.Tensor, ids: torch.Tensor, word: int
    ) -> torch.Tensor:
        """int32 bits of logit - lse for each ID; NaN for an ID outside the vocabulary."""
        raw = self._owner_words(gathered, ids, word)
        inside = (ids >= 0) & (ids < self.shard.vocab_size)
        value = raw - lse[:, None]
        return torch.where(inside, value, torch.full_like(value, float("nan"))).view(torch.int32)

    def _natural(self, gathered: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The K best (ID, bits) pairs among every rank's candidates; (-1, 0) where none is left."""
        rows = gathered.shape[1]
        keys = gathered[:, :, KEY_WORDS].permute(1, 0, 2).reshape(rows, -1)
        bits = gathered[:, :, VALUE_WORDS].permute(1, 0, 2).reshape(rows, -1)
        top, at = torch.topk(keys.contiguous().view(torch.int64), self.top_k, dim=1)
        missing = top == NO_KEY
        ids = torch.where(missing, NO_TOKEN, key_token_ids(top))
        top_bits = torch.where(missing, 0, bits.gather(1, at))
        return ids.to(torch.int32), top_bits

    def _merge(
        self,
        gathered: torch.Tensor,
        lse: torch.Tensor,
        slots: torch.Tensor,
        positions: torch.Tensor,
        chosen: torch.Tensor,
        selection: _Selection,
        out: torch.Tensor,
    ) -> None:
        """Final stage: the packed chosen pair and alternative pairs of every requesting row."""
        chosen_bits = self._reported(gathered, lse, chosen[:, None], CHOSEN_WORD)[:, 0]
        pair_ids, pair_bits = self._natural(gathered)
        live = None
        selects, selected_ids, in_prefix = selection.selects, selection.ids, selection.in_prefix
        if selected_ids is not None and in_prefix is not None:
            padding = MAX_SELECTED_IDS - self.top_k
            pair_ids = torch.nn.functional.pad(pair_ids, (0, padding), value=NO_TOKEN)
            pair_bits = torch.nn.functional.pad(pair_bits, (0, padding), value=0)
            safe = torch.where(in_prefix, selected_ids, torch.zeros_like(selected_ids))
            selected_bits = self._reported(gathered, lse, safe, SELECTED_WORDS.start)
            pair_ids = torch.where(selects[:, None], selected_ids.to(torch.int32), pair_ids)
            pair_bits = torch.where(selects[:, None], selected_bits, pair_bits)
            index = torch.arange(MAX_SELECTED_IDS, device=out.device)
            live = torch.where(selects[:, None], in_prefix, index[None, :] < self.top_k)
        write_positions(out, slots, positions, chosen, chosen_bits, pair_ids, pair_bits, live)
