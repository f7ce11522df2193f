"""The generation logprob reduction as four prepared Triton launches, bit-equal to the reference."""

from __future__ import annotations

import contextlib
import os

import torch
import triton
import triton.language as tl

from adapters.gpu.logprobs.keys import (
    CANDIDATES_PER_TILE,
    LOW_WORD,
    NAN_BITS,
    NEGATIVE_ZERO_BITS,
    NO_KEY,
)
from adapters.gpu.logprobs.normalizer import (
    EXP_COEFFICIENTS,
    EXP_HIGH,
    EXP_LOW,
    LN2_HIGH,
    LN2_LOW,
    LOG2E,
    LOG_COEFFICIENTS,
    LSE_TILE,
    SQRT_HALF,
)
from adapters.gpu.logprobs.reducer import ReductionInputs, check_inputs, check_sizes
from domain.logprobs.values import MAX_SELECTED_IDS, NATURAL_TOP_K

TILE_TREE_LEVELS = LSE_TILE.bit_length() - 1  # levels of a tile's pairwise exponential sum
# Kernels may only read module globals that are constexpr: these wrap the shared numbers.
_NAN_BITS = tl.constexpr(NAN_BITS)
_NEGATIVE_ZERO_BITS = tl.constexpr(NEGATIVE_ZERO_BITS)
_NO_KEY = tl.constexpr(NO_KEY)
_LOW_WORD = tl.constexpr(LOW_WORD)
_EXP_LOW, _EXP_HIGH = tl.constexpr(EXP_LOW), tl.constexpr(EXP_HIGH)
_LOG2E, _SQRT_HALF = tl.constexpr(LOG2E), tl.constexpr(SQRT_HALF)
_LN2_HIGH, _LN2_LOW = tl.constexpr(LN2_HIGH), tl.constexpr(LN2_LOW)
_E0, _E1, _E2, _E3, _E4, _E5 = (tl.constexpr(c) for c in EXP_COEFFICIENTS)
_L0, _L1, _L2, _L3, _L4, _L5, _L6, _L7, _L8 = (tl.constexpr(c) for c in LOG_COEFFICIENTS)


def launch_device(tensor: torch.Tensor) -> contextlib.AbstractContextManager[object]:
    """Makes `tensor`'s CUDA device current for the launches inside: Triton launches on the
    current device and its stream whatever device the pointers are on, so a rank whose tensors
    live on cuda:1 would otherwise run on cuda:0. The interpreter's CPU tensors need nothing."""
    return torch.cuda.device(tensor.device) if tensor.is_cuda else contextlib.nullcontext()


def fusion_options() -> dict:
    """Launch options that keep the reference's rounding: FMA contraction off, since a fused
    multiply-add rounds once where the reference rounds twice (the interpreter keeps defaults)."""
    return {} if os.environ.get("TRITON_INTERPRET") == "1" else {"enable_fp_fusion": False}


@triton.jit
def tl_fp32_exp(x):
    # Operation for operation the reference's fp32_exp; launches disable FMA contraction.
    finite = tl.where(x != x, 0.0, x)
    finite = tl.minimum(tl.maximum(finite, _EXP_LOW), _EXP_HIGH)
    n = tl.floor(finite * _LOG2E + 0.5)
    r = (finite - n * _LN2_HIGH) - n * _LN2_LOW
    # Horner's rule, one multiply and one add a coefficient, as the reference steps.
    poly = (((((tl.zeros_like(r) + _E0) * r + _E1) * r + _E2) * r + _E3) * r + _E4) * r + _E5
    poly = (poly * (r * r) + r) + 1.0
    scale = ((n.to(tl.int32) + 127) * (1 << 23)).to(tl.float32, bitcast=True)
    result = poly * scale
    result = tl.where(x < _EXP_LOW, 0.0, result)
    result = tl.where(x > _EXP_HIGH, float("inf"), result)
    return tl.where(x != x, x, result)


@triton.jit
def tl_fp32_log(s):
    # Operation for operation the reference's fp32_log.
    usable = (s == s) & (s > 0.0) & (s != float("inf"))
    normal = tl.where(usable, s, 1.0)
    bits = normal.to(tl.int32, bitcast=True)
    exponent = (bits >> 23) - 126
    mantissa = ((bits & 0x007FFFFF) | 0x3F000000).to(tl.float32, bitcast=True)
    small = mantissa < _SQRT_HALF
    exponent = (exponent - small.to(tl.int32)).to(tl.float32)
    f = tl.where(small, (mantissa + mantissa) - 1.0, mantissa - 1.0)
    z = f * f
    poly = ((((tl.zeros_like(f) + _L0) * f + _L1) * f + _L2) * f + _L3) * f + _L4
    poly = (((poly * f + _L5) * f + _L6) * f + _L7) * f + _L8
    y = (poly * f) * z
    y = y + exponent * _LN2_LOW
    y = y + z * -0.5
    result = (f + y) + exponent * _LN2_HIGH
    result = tl.where(s == 0.0, float("-inf"), result)
    return tl.where((s == s) & (s >= 0.0) & (s != float("inf")), result, s)


@triton.jit
def tl_finite_or_zero(peak):
    return tl.where((peak == float("inf")) | (peak == float("-inf")), 0.0, peak)


@triton.jit
def gate_row(row, slots, requested, counts, HAS_IDS: tl.constexpr, NATURAL_ONLY: tl.constexpr):
    """Whether the row's slot requests; with NATURAL_ONLY, also that it selects no IDs."""
    slot = tl.load(slots + row)
    live = tl.load(requested + slot) != 0
    if NATURAL_ONLY and HAS_IDS:
        live = live & (tl.load(counts + slot) <= 0)
    return live


@triton.jit
def tile_stats_kernel(
    logits, row_stride, slots, requested, stats, vocab, tiles,
    TILE: tl.constexpr, LOG2_TILE: tl.constexpr,
):  # fmt: skip
    row, tile = tl.program_id(0), tl.program_id(1)
    if gate_row(row, slots, requested, slots, False, False):
        lanes = tile * TILE + tl.arange(0, TILE)
        x = tl.load(
            logits + row.to(tl.int64) * row_stride + lanes,
            mask=lanes < vocab,
            other=float("-inf"),
        ).to(tl.float32)
        peak = tl.max(x, 0)
        mass = tl_fp32_exp(x - tl_finite_or_zero(peak))
        # Each level adds neighbours (2i, 2i+1): a sum over an axis of two is one addition.
        # Not tl.split: Triton 3.6 lowered split's ten levels to 84k instructions spilling a
        # 5.8 KB stack a thread, 1,800x the bytes floor on an H200 (3.9 compiled it cleanly).
        for level in tl.static_range(LOG2_TILE):
            mass = tl.sum(tl.reshape(mass, [TILE >> (level + 1), 2]), 1)
        cell = stats + (row.to(tl.int64) * tiles + tile) * 2
        tl.store(cell, peak)
        tl.store(cell + 1, tl.sum(mass, 0))


@triton.jit
def tl_row_log_normalizer(
    pairs, tile_words, tiles, TILES_BLOCK: tl.constexpr, GATHERED: tl.constexpr
):
    """The row's FP32 log normalizer from its tiles' (maximum, mass) pairs, in tile order with
    one rounding per tile, as the reference. Tile t's pair starts at word 2t of `pairs`, or at
    word tile_words[t] when GATHERED (the ranks' pairs after exchange 1)."""
    index = tl.arange(0, TILES_BLOCK)
    at = tl.load(tile_words + index, mask=index < tiles, other=0) if GATHERED else 2 * index
    peaks = tl.load(pairs + at, mask=index < tiles, other=float("-inf"))
    shift = tl_finite_or_zero(tl.max(peaks, 0))
    total = tl.zeros([1], dtype=tl.float32)
    one = tl.arange(0, 1)
    for tile in range(tiles):
        word = tl.load(tile_words + tile + one) if GATHERED else 2 * tile + one
        peak = tl.load(pairs + word)
        mass = tl.load(pairs + word + 1)
        rescaled = mass * tl_fp32_exp(tl_finite_or_zero(peak) - shift)
        total = total + tl.where(peak == float("-inf"), 0.0, rescaled)
    return tl.sum(shift + tl_fp32_log(total), 0)


@triton.jit
def _normalize_kernel(slots, requested, stats, lse, tiles, TILES_BLOCK: tl.constexpr):
    row = tl.program_id(0)
    if gate_row(row, slots, requested, slots, False, False):
        pairs = stats + row.to(tl.int64) * tiles * 2
        tl.store(lse + row, tl_row_log_normalizer(pairs, stats, tiles, TILES_BLOCK, False))


@triton.jit
def tl_order_keys(values, token_ids):
    """int64 sort keys of FP32 values and their IDs, as the reference order_keys."""
    bits = values.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    ordered = tl.where(bits == _NEGATIVE_ZERO_BITS, 0, ordered)
    return (ordered.to(tl.int64) << 32) + (_LOW_WORD - token_ids.to(tl.int64))


@triton.jit
def tile_candidates_kernel(
    logits, row_stride, slots, requested, counts, lse, keys, start, width, tiles,
    HAS_IDS: tl.constexpr, TILE: tl.constexpr, CANDIDATES: tl.constexpr,
):  # fmt: skip
    # Each tile's best keys over lanes [0, width); keys carry the global ID start + lane.
    row, tile = tl.program_id(0), tl.program_id(1)
    if gate_row(row, slots, requested, counts, HAS_IDS, True):
        lanes = tile * TILE + tl.arange(0, TILE)
        inside = lanes < width
        x = tl.load(logits + row.to(tl.int64) * row_stride + lanes, mask=inside, other=0.0)
        values = x.to(tl.float32) - tl.load(lse + row)
        ranked = tl.where(inside, tl_order_keys(values, lanes + start), _NO_KEY)
        cell = keys + (row.to(tl.int64) * tiles + tile) * CANDIDATES
        for rank in range(CANDIDATES):  # keys are unique, so equality removes exactly one
            best = tl.max(ranked, 0)
            tl.store(cell + rank, best)
            ranked = tl.where(ranked == best, _NO_KEY, ranked)


@triton.jit
def tl_open_record(row, slots, positions, chosen, lse, out, out_tokens, out_words):
    """Starts the row's packed record out[slot, position] with its chosen token's ID.

    Returns the slot, the record's first word, the chosen token (a one-lane vector) and the
    row's normalizer, which every reported value is shifted by.
    """
    slot = tl.load(slots + row).to(tl.int64)
    position = tl.load(positions + row).to(tl.int64)
    target = out + (slot * out_tokens + position) * out_words
    one = tl.arange(0, 1)
    token = tl.load(chosen + row + one).to(tl.int64)
    tl.store(target + one, token.to(tl.int32))
    return slot, target, token, tl.load(lse + row)


@triton.jit
def tl_selected_count(counts, slot, HAS_IDS: tl.constexpr, SELECTED: tl.constexpr):
    """How many selected IDs the slot's row reports (0: its natural alternatives)."""
    count = 0
    if HAS_IDS:
        count = tl.minimum(tl.load(counts + slot), SELECTED)
    return count


@triton.jit
def _reported_bits(logits_row, token_ids, wanted, vocab, shift):
    """int32 bits of logit - lse where wanted; NaN bits for IDs outside the real vocabulary."""
    inside = (token_ids >= 0) & (token_ids < vocab)
    safe = tl.where(wanted & inside, token_ids, 0)
    x = tl.load(logits_row + safe, mask=wanted & inside, other=0.0).to(tl.float32)
    bits = (x - shift).to(tl.int32, bitcast=True)
    return tl.where(inside, bits, _NAN_BITS)


@triton.jit
def _merge_kernel(
    logits, row_stride, slots, positions, chosen, requested, counts, token_ids, lse, keys,
    out, out_tokens, out_words, vocab, tiles,
    HAS_IDS: tl.constexpr, TOP_K: tl.constexpr, CANDIDATES_BLOCK: tl.constexpr,
    CANDIDATES: tl.constexpr, SELECTED: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    if gate_row(row, slots, requested, counts, HAS_IDS, False):
        slot, target, token, shift = tl_open_record(
            row, slots, positions, chosen, lse, out, out_tokens, out_words
        )
        logits_row = logits + row.to(tl.int64) * row_stride
        one = tl.arange(0, 1)
        tl.store(target + 1 + one, _reported_bits(logits_row, token, one == 0, vocab, shift))
        count = tl_selected_count(counts, slot, HAS_IDS, SELECTED)
        if count > 0:
            index = tl.arange(0, SELECTED)
            live = index < count
            ids = tl.load(token_ids + slot * SELECTED + index, mask=live, other=0)
            bits = _reported_bits(logits_row, ids.to(tl.int64), live, vocab, shift)
            tl.store(target + 2 + 2 * index, ids, mask=live)
            tl.store(target + 3 + 2 * index, bits, mask=live)
        else:
            # Not `index`: a name bound in both branches keeps one shape (Triton 3.9 insists).
            candidate = tl.arange(0, CANDIDATES_BLOCK)
            ranked = tl.load(
                keys + row.to(tl.int64) * tiles * CANDIDATES + candidate,
                mask=candidate < tiles * CANDIDATES,
                other=_NO_KEY,
            )
            for rank in range(TOP_K):
                best = tl.max(ranked, 0)
                ranked = tl.where(ranked == best, _NO_KEY, ranked)
                found = (best + one) != _NO_KEY  # a vocabulary smaller than K runs out
                token_id = tl.where(found, _LOW_WORD - (best & _LOW_WORD), -1)
                bits = _reported_bits(logits_row, token_id, found, vocab, shift)
                tl.store(target + 2 + 2 * rank + one, token_id.to(tl.int32))
                tl.store(target + 3 + 2 * rank + one, tl.where(found, bits, 0))


def id_operands(
    requested: torch.Tensor, counts: torch.Tensor | None, token_ids: torch.Tensor | None
) -> tuple[bool, torch.Tensor, torch.Tensor]:
    """(HAS_IDS, counts, token_ids) for a launch: without selected IDs the kernels never read
    the last two, so `requested` stands in for them (a launch takes no None pointer)."""
    if counts is None or token_ids is None:
        return False, requested, requested
    return True, counts, token_ids


class TritonLogprobReducer:
    """`LogprobReducer` writing the reference's words from four Triton launches over the tiles.

    Every row of `logits` gets programs; a row whose slot has a zero flag stops after reading
    it, so no host synchronization chooses the rows. Workspaces (per-tile maxima and masses,
    per-tile best keys, one normalization per row) are kept for the largest row count seen.
    """

    def __init__(self, vocab_size: int, top_k: int = NATURAL_TOP_K) -> None:
        check_sizes(vocab_size, top_k)
        self.vocab_size = vocab_size
        self.top_k = top_k
        self.tiles = -(-vocab_size // LSE_TILE)
        self._workspace: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def reserve(self, capacity: int, device: torch.device | str) -> None:
        """Allocates the workspaces for up to `capacity` rows (before capture, for instance)."""
        self._reserved(capacity, device)

    def _reserved(
        self, capacity: int, device: torch.device | str
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The workspaces, allocated first if they hold fewer rows or live elsewhere."""
        # A bare "cuda" names the current device; normalize so the comparison below is exact and
        # a graph captured over these workspaces never sees them reallocated.
        device = torch.empty(0, device=device).device
        workspace = self._workspace
        if (
            workspace is not None
            and workspace[2].shape[0] >= capacity
            and workspace[2].device == torch.device(device)
        ):
            return workspace
        rows = max(capacity, 1)
        self._workspace = (
            torch.empty((rows, self.tiles, 2), dtype=torch.float32, device=device),
            torch.empty((rows, self.tiles, CANDIDATES_PER_TILE), dtype=torch.int64, device=device),
            torch.empty(rows, dtype=torch.float32, device=device),
        )
        return self._workspace

    def reduce(self, inputs: ReductionInputs) -> None:
        """The reference's words, from the four launches (see `LogprobReducer`)."""
        check_inputs(inputs, self.vocab_size, self.top_k)
        logits, slots, positions, chosen, requested, counts, token_ids, out = inputs
        rows = logits.shape[0]
        if rows == 0:
            return
        if logits.stride(1) != 1:
            logits = logits.contiguous()
        stats, keys, lse = self._reserved(rows, logits.device)
        has_ids, counts, token_ids = id_operands(requested, counts, token_ids)
        common = fusion_options()
        row_stride, vocab, tiles = logits.stride(0), self.vocab_size, self.tiles
        with launch_device(logits):
            tile_stats_kernel[(rows, tiles)](
                logits, row_stride, slots, requested, stats, vocab, tiles,
                TILE=LSE_TILE, LOG2_TILE=TILE_TREE_LEVELS, **common,
            )  # fmt: skip
            _normalize_kernel[(rows,)](
                slots, requested, stats, lse, tiles,
                TILES_BLOCK=triton.next_power_of_2(tiles), **common,
            )  # fmt: skip
            tile_candidates_kernel[(rows, tiles)](
                logits, row_stride, slots, requested, counts, lse, keys, 0, vocab, tiles,
                HAS_IDS=has_ids, TILE=LSE_TILE, CANDIDATES=CANDIDATES_PER_TILE, **common,
            )  # fmt: skip
            _merge_kernel[(rows,)](
                logits, row_stride, slots, positions, chosen, requested, counts, token_ids, lse,
                keys, out, out.shape[1], out.shape[2], vocab, tiles,
                HAS_IDS=has_ids, TOP_K=self.top_k,
                CANDIDATES_BLOCK=triton.next_power_of_2(tiles * CANDIDATES_PER_TILE),
                CANDIDATES=CANDIDATES_PER_TILE, SELECTED=MAX_SELECTED_IDS, **common,
            )  # fmt: skip
