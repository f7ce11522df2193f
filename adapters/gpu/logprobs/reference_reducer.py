"""The torch reference of the generation logprob reduction into the packed completion frame."""

from __future__ import annotations

import math

import torch

from domain.logprobs import MAX_SELECTED_IDS, NATURAL_TOP_K, NO_TOKEN

_LOGIT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_INT32_MIN = -(2**31)
_LOW_WORD = 0xFFFFFFFF


def order_keys(values: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """int64 sort keys of FP32 `values` and their IDs, equal to `domain.logprobs.sort_key`.

    Larger key = larger value, then smaller token ID; -0.0 ranks as +0.0.
    """
    bits = values.view(torch.int32)
    # Negative floats order backwards in their magnitude bits, so those bits are flipped.
    ordered = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    ordered = ordered.masked_fill(bits == _INT32_MIN, 0)
    # Multiplying rather than shifting keeps negative high words well defined on every backend.
    return ordered.to(torch.int64) * (1 << 32) + (_LOW_WORD - token_ids.to(torch.int64))


# The normalization is a fixed sequence of FP32 operations that the Triton reducer repeats one
# for one, so both produce the same bits: per-tile maxima and pairwise exponential sums, tiles
# combined in order, and exp/log built from FP32 multiplies and adds only, since library exp
# and log round differently on every backend.
LSE_TILE = 1024
_SPARE_CANDIDATES = 8
EXP_LOW, EXP_HIGH = -86.0, 88.0  # outside: exactly 0 or inf, never a subnormal result
LOG2E = 1.4426950408889634
LN2_HIGH, LN2_LOW = 0.693359375, -2.12194440e-4
EXP_COEFFICIENTS = (
    1.9875691500e-4,
    1.3981999507e-3,
    8.3334519073e-3,
    4.1665795894e-2,
    1.6666665459e-1,
    5.0000001201e-1,
)
LOG_COEFFICIENTS = (
    7.0376836292e-2,
    -1.1514610310e-1,
    1.1676998740e-1,
    -1.2420140846e-1,
    1.4249322787e-1,
    -1.6668057665e-1,
    2.0000714765e-1,
    -2.4999993993e-1,
    3.3333331174e-1,
)
SQRT_HALF = 0.70710677


_CPU_GROUP_LANES = 1 << 19


def fp32_exp(x: torch.Tensor) -> torch.Tensor:
    """exp of FP32 `x` from FP32 adds and multiplies: 2^n * p(r) with r = x - n*ln2."""
    # In-place steps keep the exact operation order while sparing the CPU reference a temporary
    # per step (it serves every logprob request on CPU).
    finite = torch.nan_to_num(x, nan=0.0).clamp_(EXP_LOW, EXP_HIGH)
    n = (finite * LOG2E).add_(0.5).floor_()
    r = finite.sub_(n * LN2_HIGH).sub_(n * LN2_LOW)
    poly = torch.full_like(r, EXP_COEFFICIENTS[0])
    for coefficient in EXP_COEFFICIENTS[1:]:
        poly.mul_(r).add_(coefficient)
    poly.mul_(r * r).add_(r).add_(1.0)
    scale = n.to(torch.int32).add_(127).mul_(1 << 23).view(torch.float32)
    result = poly.mul_(scale)
    result.masked_fill_(x < EXP_LOW, 0.0)
    result.masked_fill_(x > EXP_HIGH, math.inf)
    return torch.where(torch.isnan(x), x, result)


def fp32_log(s: torch.Tensor) -> torch.Tensor:
    """log of FP32 `s` >= 1, 0 or inf (what an exponential mass can be), from FP32 arithmetic."""
    normal = torch.where(torch.isfinite(s) & (s > 0), s, torch.ones_like(s))
    bits = normal.view(torch.int32)
    exponent = (bits >> 23) - 126
    mantissa = ((bits & 0x007FFFFF) | 0x3F000000).view(torch.float32)  # in [0.5, 1)
    small = mantissa < SQRT_HALF
    exponent = (exponent - small.to(torch.int32)).to(torch.float32)
    f = torch.where(small, (mantissa + mantissa) - 1.0, mantissa - 1.0)
    z = f * f
    poly = torch.full_like(f, LOG_COEFFICIENTS[0])
    for coefficient in LOG_COEFFICIENTS[1:]:
        poly = poly * f + coefficient
    y = (poly * f) * z
    y = y + exponent * LN2_LOW
    y = y + z * -0.5
    result = (f + y) + exponent * LN2_HIGH
    result = torch.where(s == 0, torch.full_like(s, -math.inf), result)
    return torch.where(torch.isfinite(s) & (s >= 0), result, s)


def _finite_or_zero(peak: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isinf(peak), torch.zeros_like(peak), peak)


def tile_statistics(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per LSE_TILE lanes of FP32 `rows` [n, V]: the tile maximum and its exponential mass.

    Returns peaks and masses [n, ceil(V / LSE_TILE)]: each mass is the pairwise-tree sum of
    exp(x - shift), shift being the tile maximum or 0 where that is infinite. A short last tile
    is padded with -inf, which adds nothing. Each tile depends on its own lanes only, so a
    vocabulary shard starting on a tile boundary gets the same bits as the whole row.
    """
    count, vocab = rows.shape
    group = max(1, _CPU_GROUP_LANES // max(vocab, 1))
    if rows.device.type != "cpu" or count <= group:
        return _tile_statistics(rows)
    # PERF: on the CPU the exp polynomial makes a dozen passes over its input; row groups of
    # about 2 MiB stay in cache through all of them (3x faster for 64 rows of 49,152). Rows are
    # independent, so the bits are the same.
    parts = [_tile_statistics(rows[start : start + group]) for start in range(0, count, group)]
    return torch.cat([peaks for peaks, _ in parts]), torch.cat([mass for _, mass in parts])


def _tile_statistics(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`tile_statistics` over one group of rows."""
    count, vocab = rows.shape
    tiles = -(-vocab // LSE_TILE)
    missing = tiles * LSE_TILE - vocab
    lanes = torch.nn.functional.pad(rows, (0, missing), value=-math.inf) if missing else rows
    lanes = lanes.reshape(count, tiles, LSE_TILE)
    peaks = lanes.amax(dim=2)
    mass = fp32_exp(lanes - _finite_or_zero(peaks)[:, :, None])
    while mass.shape[2] > 1:  # a pairwise tree: neighbours (2i, 2i+1) add at every level
        pairs = mass.view(count, tiles, mass.shape[2] // 2, 2)
        mass = pairs[:, :, :, 0] + pairs[:, :, :, 1]
    return peaks, mass[:, :, 0]


def combine_tiles(peaks: torch.Tensor, masses: torch.Tensor) -> torch.Tensor:
    """The FP32 log normalizer [n] from tile statistics [n, tiles >= 1] in global tile order."""
    shifts = _finite_or_zero(peaks)
    shift = _finite_or_zero(peaks.amax(dim=1))
    rescaled = masses * fp32_exp(shifts - shift[:, None])
    # An all -inf tile holds no mass; its factor may overflow, so it is dropped, not scaled.
    rescaled = torch.where(peaks == -math.inf, torch.zeros_like(rescaled), rescaled)
    total = torch.zeros_like(shift)
    for tile in range(peaks.shape[1]):  # in tile order, one rounding per tile
        total = total + rescaled[:, tile]
    return shift + fp32_log(total)


def _log_normalizer(rows: torch.Tensor) -> torch.Tensor:
    """FP32 log-sum-exp of each row by the shared tiled recipe; an all -inf row gives -inf."""
    return combine_tiles(*tile_statistics(rows))


def top_sort_keys(values: torch.Tensor, k: int) -> torch.Tensor:
    """The k largest `order_keys` of each row of FP32 `values` (all lanes real), descending.

    PERF: keys are built only for the best k + 8 values by float order. That set holds every
    value >= the k-th one unless the value at its end still equals the k-th (ties run past
    it); such rows fall back to keys over the whole row. The result is the same either way.
    """
    width = values.shape[1]
    candidates = min(width, k + _SPARE_CANDIDATES)
    best, best_ids = torch.topk(values, candidates, dim=1)
    keys = torch.topk(order_keys(best, best_ids), k, dim=1).values
    if candidates == width:
        return keys
    crowded = (best[:, -1] == best[:, k - 1]).nonzero().flatten()
    if crowded.numel():
        ids = torch.arange(width, dtype=torch.int64, device=values.device)
        full = order_keys(values.index_select(0, crowded), ids)
        keys[crowded] = torch.topk(full, k, dim=1).values
    return keys


def check_bundle(
    out: torch.Tensor, counts: torch.Tensor | None, token_ids: torch.Tensor | None, top_k: int
) -> None:
    """The frame and ID inputs every reducer writes and reads have the contract's forms."""
    if (counts is None) != (token_ids is None):
        raise ValueError("counts and token_ids are declared together or not at all")
    needed = MAX_SELECTED_IDS if counts is not None else top_k
    if out.dtype != torch.int32 or out.dim() != 3 or out.shape[2] < 2 + 2 * needed:
        raise ValueError(
            f"out must be int32 [capacity, T, >= {2 + 2 * needed}], got "
            f"{out.dtype} {tuple(out.shape)}"
        )
    if not out.is_contiguous():
        raise ValueError("out must be contiguous: it is written through its flat view")


class ReferenceLogprobReducer:
    """Reports sampled rows' logprobs into `completion_logprobs` with torch operations.

    The only host synchronization is choosing the requesting rows, whose count shapes the work;
    everything after it is shape-static, so no other device value reaches the host.
    """

    def __init__(self, vocab_size: int, top_k: int = NATURAL_TOP_K) -> None:
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be positive, got {vocab_size}")
        if not 1 <= top_k <= NATURAL_TOP_K:
            raise ValueError(f"top_k must be in 1..{NATURAL_TOP_K}, got {top_k}")
        self.vocab_size = vocab_size
        self.top_k = top_k

    def reduce(
        self,
        logits: torch.Tensor,
        slots: torch.Tensor,
        positions: torch.Tensor,
        chosen: torch.Tensor,
        requested: torch.Tensor,
        counts: torch.Tensor | None,
        token_ids: torch.Tensor | None,
        out: torch.Tensor,
    ) -> None:
        """Writes each requesting row's chosen pair and alternative pairs to out[slot, position].

        `logits` [R, V_padded] are the raw rows before any sampling transform and are only read.
        Rows whose slot has a zero `requested` flag are neither read nor written. A slot with a
        positive count gets its first `count` IDs of `token_ids` in caller order; otherwise it
        gets the K natural alternatives (ID -1, bits 0 past a vocabulary smaller than K). Words
        past those pairs keep their contents. Selected or chosen IDs outside the real vocabulary
        report NaN instead of reading a padded lane.
        """
        self._check(logits, out, counts, token_ids)
        wanted = requested.index_select(0, slots) != 0
        rows = torch.nonzero(wanted).squeeze(1)
        if rows.numel() == 0:
            return
        slots, positions = slots.index_select(0, rows), positions.index_select(0, rows)
        chosen = chosen.index_select(0, rows).to(torch.int64)
        values = self._reported_values(logits, rows)
        natural_ids, natural_bits = self._natural(values)
        pair_ids, pair_bits, live = natural_ids, natural_bits, None
        if counts is not None and token_ids is not None:
            pair_ids, pair_bits, live = self._with_selected(
                values, slots, counts, token_ids, natural_ids, natural_bits
            )
        chosen_bits = self._read(values, chosen, torch.ones_like(chosen, dtype=torch.bool))
        write_positions(out, slots, positions, chosen, chosen_bits, pair_ids, pair_bits, live)

    def _check(
        self,
        logits: torch.Tensor,
        out: torch.Tensor,
        counts: torch.Tensor | None,
        token_ids: torch.Tensor | None,
    ) -> None:
        if logits.dtype not in _LOGIT_DTYPES:
            raise TypeError(f"logits must be float32, bfloat16 or float16, got {logits.dtype}")
        if logits.dim() != 2 or logits.shape[1] < self.vocab_size:
            raise ValueError(
                f"logits must be [rows, >= {self.vocab_size}], got {tuple(logits.shape)}"
            )
        check_bundle(out, counts, token_ids, self.top_k)

    def _reported_values(self, logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """FP32 logit - lse over the real vocabulary of the requesting rows only."""
        real = logits[:, : self.vocab_size].index_select(0, rows).to(torch.float32)
        return real.sub_(_log_normalizer(real)[:, None])

    def _natural(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The top-K (ID, bits) pairs by sort key, padded with (-1, 0) past the vocabulary."""
        top_keys = top_sort_keys(values, min(self.top_k, self.vocab_size))
        top_ids = _LOW_WORD - (top_keys & _LOW_WORD)
        # Bits come from the values themselves, so a reported -0.0 keeps its sign.
        top_bits = values.gather(1, top_ids).view(torch.int32)
        missing = self.top_k - top_ids.shape[1]
        if missing:
            top_ids = torch.nn.functional.pad(top_ids, (0, missing), value=NO_TOKEN)
            top_bits = torch.nn.functional.pad(top_bits, (0, missing), value=0)
        return top_ids.to(torch.int32), top_bits

    def _with_selected(
        self,
        values: torch.Tensor,
        slots: torch.Tensor,
        counts: torch.Tensor,
        token_ids: torch.Tensor,
        natural_ids: torch.Tensor,
        natural_bits: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per row: the selected pairs when its count is positive, else the natural ones.

        Returns the [rows, 128] pair IDs and bits and which of those pairs are to be written.
        """
        count = counts.index_select(0, slots).to(torch.int64).clamp(max=MAX_SELECTED_IDS)
        selects = count > 0
        index = torch.arange(MAX_SELECTED_IDS, device=values.device)
        # IDs past a slot's uploaded prefix are stale, so they are never used as read indices.
        in_prefix = index[None, :] < count[:, None]
        selected_ids = token_ids.index_select(0, slots).to(torch.int64)
        selected_bits = self._read(values, selected_ids, in_prefix)
        padding = MAX_SELECTED_IDS - self.top_k
        natural_ids = torch.nn.functional.pad(natural_ids, (0, padding), value=NO_TOKEN)
        natural_bits = torch.nn.functional.pad(natural_bits, (0, padding), value=0)
        pair_ids = torch.where(selects[:, None], selected_ids.to(torch.int32), natural_ids)
        pair_bits = torch.where(selects[:, None], selected_bits, natural_bits)
        live = torch.where(selects[:, None], in_prefix, index[None, :] < self.top_k)
        return pair_ids, pair_bits, live

    def _read(self, values: torch.Tensor, ids: torch.Tensor, wanted: torch.Tensor) -> torch.Tensor:
        """int32 bits of values[row, id] where wanted; NaN bits for an ID outside the vocabulary."""
        inside = (ids >= 0) & (ids < self.vocab_size)
        safe = torch.where(wanted & inside, ids, torch.zeros_like(ids))
        squeeze = ids.dim() == 1
        read = values.gather(1, safe[:, None] if squeeze else safe)
        read = read.squeeze(1) if squeeze else read
        return torch.where(inside, read, torch.full_like(read, float("nan"))).view(torch.int32)


def write_positions(
    out: torch.Tensor,
    slots: torch.Tensor,
    positions: torch.Tensor,
    chosen: torch.Tensor,
    chosen_bits: torch.Tensor,
    pair_ids: torch.Tensor,
    pair_bits: torch.Tensor,
    live: torch.Tensor | None,
) -> None:
    """Scatters the payload into the flat frame, touching only the words that carry data.

    A pair that must stay unwritten is aimed at pair 0 with pair 0's own words (pair 0 is
    always written), so the scatter keeps a static shape and needs no mask on the host.
    """
    pairs = pair_ids.shape[1]
    index = torch.arange(pairs, device=out.device).expand(pair_ids.shape[0], pairs)
    if live is not None:
        index = torch.where(live, index, torch.zeros_like(index))
        pair_ids = torch.where(live, pair_ids, pair_ids[:, :1])
        pair_bits = torch.where(live, pair_bits, pair_bits[:, :1])
    words = torch.cat(
        [
            chosen.to(torch.int32)[:, None],
            chosen_bits[:, None],
            torch.stack([pair_ids, pair_bits], dim=2).flatten(1),
        ],
        dim=1,
    )
    offsets = torch.cat(
        [
            torch.arange(2, device=out.device).expand(index.shape[0], 2),
            torch.stack([2 + 2 * index, 3 + 2 * index], dim=2).flatten(1),
        ],
        dim=1,
    )
    base = (slots * out.shape[1] + positions) * out.shape[2]
    out.view(-1).scatter_(0, (base[:, None] + offsets).flatten(), words.flatten())
