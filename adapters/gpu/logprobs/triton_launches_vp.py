"""The six vocabulary-parallel Triton launches, grouped into the three steps between exchanges."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from adapters.gpu.logprobs.keys import CANDIDATES_PER_TILE, LOW_WORD, NAN_BITS, NO_KEY
from adapters.gpu.logprobs.normalizer import LSE_TILE
from adapters.gpu.logprobs.reference_reducer_vp import CHOSEN_WORD, EXCHANGE_WORDS, VALUE_WORDS
from adapters.gpu.logprobs.triton_reducer import (
    TILE_TREE_LEVELS,
    fusion_options,
    gate_row,
    id_operands,
    launch_device,
    tile_candidates_kernel,
    tile_stats_kernel,
    tl_open_record,
    tl_row_log_normalizer,
    tl_selected_count,
)
from domain.logprobs.values import MAX_SELECTED_IDS

# Kernels may only read module globals that are constexpr: these wrap the shared numbers.
_NAN_BITS = tl.constexpr(NAN_BITS)
_NO_KEY = tl.constexpr(NO_KEY)
_LOW_WORD = tl.constexpr(LOW_WORD)


@triton.jit
def _pack_statistics_kernel(slots, requested, stats, send, tiles, stats_tiles, WORDS: tl.constexpr):
    # Exchange 1: the shard's (maximum, mass) pairs in tile order, every other word zero.
    row = tl.program_id(0)
    if gate_row(row, slots, requested, slots, False, False):
        index = tl.arange(0, WORDS)
        pairs = tl.load(
            stats + row.to(tl.int64) * stats_tiles * 2 + index, mask=index < 2 * tiles, other=0
        )
        tl.store(send + row.to(tl.int64) * WORDS + index, pairs)


@triton.jit
def _combine_kernel(
    slots, requested, gathered, tile_words, lse, tiles,
    TILES_BLOCK: tl.constexpr, WORDS: tl.constexpr,
):  # fmt: skip
    # tile_words[g] locates global tile g's pair in the gathered words, so this is the
    # single-rank normalization over the same tiles in the same order.
    row = tl.program_id(0)
    if gate_row(row, slots, requested, slots, False, False):
        pairs = gathered + row.to(tl.int64) * WORDS
        tl.store(lse + row, tl_row_log_normalizer(pairs, tile_words, tiles, TILES_BLOCK, True))


@triton.jit
def _owned_bits(logits_row, token_ids, wanted, start, width):
    """int32 bits of the raw FP32 logit of each wanted ID in [start, start + width); else NaN."""
    owns = wanted & (token_ids >= start) & (token_ids < start + width)
    local = tl.where(owns, token_ids - start, 0)
    x = tl.load(logits_row + local, mask=owns, other=0.0).to(tl.float32)
    return tl.where(owns, x.to(tl.int32, bitcast=True), _NAN_BITS)


@triton.jit
def _pack_candidates_kernel(
    logits, row_stride, slots, chosen, requested, counts, token_ids, lse, keys, send, send_keys,
    start, width, tiles,
    HAS_IDS: tl.constexpr, CANDIDATES: tl.constexpr, CANDIDATES_BLOCK: tl.constexpr,
    SELECTED: tl.constexpr, WORDS: tl.constexpr, VALUE_WORD: tl.constexpr,
    CHOSEN_WORD: tl.constexpr,
):  # fmt: skip
    # Exchange 2. Every word of a live row is written exactly once (the store masks are
    # disjoint), so no word of exchange 1 or of an earlier call travels again.
    row = tl.program_id(0)
    if gate_row(row, slots, requested, counts, HAS_IDS, False):
        slot = tl.load(slots + row).to(tl.int64)
        logits_row = logits + row.to(tl.int64) * row_stride
        words = send + row.to(tl.int64) * WORDS
        index = tl.arange(0, WORDS)
        one = tl.arange(0, 1)
        token = tl.load(chosen + row + one).to(tl.int64)
        tl.store(words + CHOSEN_WORD + one, _owned_bits(logits_row, token, one == 0, start, width))
        count = tl_selected_count(counts, slot, HAS_IDS, SELECTED)
        if count > 0:
            picked = tl.arange(0, SELECTED)
            live = picked < count
            ids = tl.load(token_ids + slot * SELECTED + picked, mask=live, other=0).to(tl.int64)
            tl.store(words + picked, _owned_bits(logits_row, ids, live, start, width))
            tl.store(words + index, 0, mask=index > CHOSEN_WORD)
        else:
            shift = tl.load(lse + row)
            candidate = tl.arange(0, CANDIDATES_BLOCK)
            ranked = tl.load(
                keys + row.to(tl.int64) * tiles * CANDIDATES + candidate,
                mask=candidate < tiles * CANDIDATES,
                other=_NO_KEY,
            )
            row_keys = send_keys + row.to(tl.int64) * (WORDS // 2)
            for rank in range(CANDIDATES):
                best = tl.max(ranked, 0)
                ranked = tl.where(ranked == best, _NO_KEY, ranked)
                key = tl.zeros([1], dtype=tl.int64) + best
                found = key != _NO_KEY  # a shard narrower than 32 lanes runs out
                local = tl.where(found, (_LOW_WORD - (key & _LOW_WORD)) - start, 0)
                x = tl.load(logits_row + local, mask=found, other=0.0).to(tl.float32)
                bits = tl.where(found, (x - shift).to(tl.int32, bitcast=True), 0)
                tl.store(row_keys + rank + one, key)
                tl.store(words + VALUE_WORD + rank + one, bits)
            unused = (index >= VALUE_WORD + CANDIDATES) & (index != CHOSEN_WORD)
            tl.store(words + index, 0, mask=unused)


@triton.jit
def _gathered_bits(row_words, peer_words, stops, world, token_ids, word, wanted, vocab, shift,
                   WORLD_BLOCK: tl.constexpr):  # fmt: skip
    """int32 bits of raw - lse, the raw word at `word` of the rank owning each ID; NaN outside."""
    inside = (token_ids >= 0) & (token_ids < vocab)
    clamped = tl.minimum(tl.maximum(token_ids, 0), vocab - 1)
    peers = tl.arange(0, WORLD_BLOCK)
    stop = tl.load(stops + peers, mask=peers < world, other=vocab)
    # The first rank whose stop lies past the ID; empty ranges never own one.
    owner = tl.sum((stop[None, :] <= clamped[:, None]).to(tl.int64), 1)
    raw = tl.load(row_words + owner * peer_words + word, mask=wanted, other=0)
    bits = (raw.to(tl.float32, bitcast=True) - shift).to(tl.int32, bitcast=True)
    return tl.where(inside, bits, _NAN_BITS)


@triton.jit
def _final_merge_kernel(
    gathered, gathered_keys, peer_words, stops, world, slots, positions, chosen, requested,
    counts, token_ids, lse, out, out_tokens, out_words, vocab,
    HAS_IDS: tl.constexpr, TOP_K: tl.constexpr, CANDIDATES: tl.constexpr,
    CANDIDATES_BLOCK: tl.constexpr, WORLD_BLOCK: tl.constexpr, SELECTED: tl.constexpr,
    WORDS: tl.constexpr, VALUE_WORD: tl.constexpr, CHOSEN_WORD: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    row_words = gathered + row.to(tl.int64) * WORDS
    if gate_row(row, slots, requested, counts, HAS_IDS, False):
        slot, target, token, shift = tl_open_record(
            row, slots, positions, chosen, lse, out, out_tokens, out_words
        )
        one = tl.arange(0, 1)
        chosen_bits = _gathered_bits(
            row_words, peer_words, stops, world, token, CHOSEN_WORD, one == 0, vocab, shift,
            WORLD_BLOCK,
        )  # fmt: skip
        tl.store(target + 1 + one, chosen_bits)
        count = tl_selected_count(counts, slot, HAS_IDS, SELECTED)
        if count > 0:
            index = tl.arange(0, SELECTED)
            live = index < count
            ids = tl.load(token_ids + slot * SELECTED + index, mask=live, other=0)
            bits = _gathered_bits(
                row_words, peer_words, stops, world, ids.to(tl.int64), index, live, vocab,
                shift, WORLD_BLOCK,
            )  # fmt: skip
            tl.store(target + 2 + 2 * index, ids, mask=live)
            tl.store(target + 3 + 2 * index, bits, mask=live)
        else:
            candidate = tl.arange(0, CANDIDATES_BLOCK)
            offered = candidate < world * CANDIDATES
            peer = (candidate // CANDIDATES).to(tl.int64)
            rank_words = row.to(tl.int64) * WORDS + peer * peer_words
            ranked = tl.load(
                gathered_keys + rank_words // 2 + candidate % CANDIDATES,
                mask=offered,
                other=_NO_KEY,
            )
            values = tl.load(
                gathered + rank_words + VALUE_WORD + candidate % CANDIDATES, mask=offered, other=0
            )
            for rank in range(TOP_K):
                best = tl.max(ranked, 0)
                hit = ranked == best
                ranked = tl.where(hit, _NO_KEY, ranked)
                key = tl.zeros([1], dtype=tl.int64) + best
                found = key != _NO_KEY  # a vocabulary smaller than K runs out
                # A real key is unique, so the masked sum is the one value sent with it.
                bits = tl.sum(tl.where(hit, values, 0), 0)
                token_id = tl.where(found, _LOW_WORD - (key & _LOW_WORD), -1)
                tl.store(target + 2 + 2 * rank + one, token_id.to(tl.int32))
                tl.store(target + 3 + 2 * rank + one, tl.where(found, bits, 0))


def statistics(
    logits: torch.Tensor,
    slots: torch.Tensor,
    requested: torch.Tensor,
    stats: torch.Tensor,
    send: torch.Tensor,
    width: int,
) -> None:
    """Before exchange 1: the shard's tile statistics into `stats`, packed into `send`.

    One program row per logits row; `stats` [>= R, tiles or 1, 2] and `send` [>= R, 256].
    """
    rows, stats_tiles = logits.shape[0], stats.shape[1]
    common = fusion_options()
    with launch_device(logits):
        tile_stats_kernel[(rows, stats_tiles)](
            logits, logits.stride(0), slots, requested, stats, width, stats_tiles,
            TILE=LSE_TILE, LOG2_TILE=TILE_TREE_LEVELS, **common,
        )  # fmt: skip
        _pack_statistics_kernel[(rows,)](
            slots, requested, stats.view(torch.int32), send, -(-width // LSE_TILE), stats_tiles,
            WORDS=EXCHANGE_WORDS, **common,
        )  # fmt: skip


def candidates(
    logits: torch.Tensor,
    slots: torch.Tensor,
    chosen: torch.Tensor,
    requested: torch.Tensor,
    counts: torch.Tensor | None,
    token_ids: torch.Tensor | None,
    received: torch.Tensor,
    tile_words: torch.Tensor,
    lse: torch.Tensor,
    keys: torch.Tensor,
    send: torch.Tensor,
    start: int,
    width: int,
) -> None:
    """Between the exchanges: the global normalizer into `lse` from exchange 1's `received`
    [world, reserved rows, 256], the shard's tile candidates into `keys` and exchange 2's words
    into `send`."""
    rows, stats_tiles = logits.shape[0], keys.shape[1]
    has_ids, counts, token_ids = id_operands(requested, counts, token_ids)
    common, row_stride = fusion_options(), logits.stride(0)
    total_tiles = tile_words.shape[0]
    with launch_device(logits):
        _combine_kernel[(rows,)](
            slots, requested, received.view(torch.float32), tile_words, lse, total_tiles,
            TILES_BLOCK=triton.next_power_of_2(total_tiles), WORDS=EXCHANGE_WORDS, **common,
        )  # fmt: skip
        tile_candidates_kernel[(rows, stats_tiles)](
            logits, row_stride, slots, requested, counts, lse, keys, start, width, stats_tiles,
            HAS_IDS=has_ids, TILE=LSE_TILE, CANDIDATES=CANDIDATES_PER_TILE, **common,
        )  # fmt: skip
        _pack_candidates_kernel[(rows,)](
            logits, row_stride, slots, chosen, requested, counts, token_ids, lse, keys, send,
            send.view(torch.int64), start, width, stats_tiles,
            HAS_IDS=has_ids, CANDIDATES=CANDIDATES_PER_TILE,
            CANDIDATES_BLOCK=triton.next_power_of_2(stats_tiles * CANDIDATES_PER_TILE),
            SELECTED=MAX_SELECTED_IDS, WORDS=EXCHANGE_WORDS, VALUE_WORD=VALUE_WORDS.start,
            CHOSEN_WORD=CHOSEN_WORD, **common,
        )  # fmt: skip


def merge(
    received: torch.Tensor,
    stops: torch.Tensor,
    slots: torch.Tensor,
    positions: torch.Tensor,
    chosen: torch.Tensor,
    requested: torch.Tensor,
    counts: torch.Tensor | None,
    token_ids: torch.Tensor | None,
    lse: torch.Tensor,
    out: torch.Tensor,
    vocab_size: int,
    top_k: int,
) -> None:
    """After exchange 2: the packed output of every requesting row into `out`.

    `received` [world, R, 256] holds exchange 2's rows (a view of the reserved buffer serves:
    its first stride separates the ranks), one program per row; `stops` [world] ends each
    rank's range.
    """
    world, rows = received.shape[0], received.shape[1]
    has_ids, counts, token_ids = id_operands(requested, counts, token_ids)
    with launch_device(received):
        _final_merge_kernel[(rows,)](
            received, received.view(torch.int64), received.stride(0), stops, world, slots,
            positions, chosen, requested, counts, token_ids, lse, out, out.shape[1], out.shape[2],
            vocab_size,
            HAS_IDS=has_ids, TOP_K=top_k, CANDIDATES=CANDIDATES_PER_TILE,
            CANDIDATES_BLOCK=triton.next_power_of_2(world * CANDIDATES_PER_TILE),
            WORLD_BLOCK=triton.next_power_of_2(world), SELECTED=MAX_SELECTED_IDS,
            WORDS=EXCHANGE_WORDS, VALUE_WORD=VALUE_WORDS.start, CHOSEN_WORD=CHOSEN_WORD,
            **fusion_options(),
        )  # fmt: skip
