"""The fixed FP32 log-sum-exp that every reducer and scorer repeats bit for bit."""

from __future__ import annotations

import math

import torch

from adapters.gpu.logprobs import native_reduction

# The normalization is a fixed sequence of FP32 operations that the Triton reducer repeats one
# for one, so both produce the same bits: per-tile maxima and pairwise exponential sums, tiles
# combined in order, and exp/log built from FP32 multiplies and adds only, since library exp
# and log round differently on every backend.
LSE_TILE = 1024
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
    vocabulary shard starting on a tile boundary gets the same bits as the whole row. CPU rows
    go through the compiled kernel when it is built (`native_reduction`), with the same bits.
    """
    fast = native_reduction.tile_statistics(rows, LSE_TILE)
    return fast if fast is not None else torch_tile_statistics(rows)


def torch_tile_statistics(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`tile_statistics` by torch operations: the recipe itself, on every device."""
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


def _rescaled_total(peaks: torch.Tensor, masses: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """The masses of tile statistics [..., tiles] moved from each tile's shift to `shift` [...]
    and summed in tile order, one rounding per tile."""
    rescaled = masses * fp32_exp(_finite_or_zero(peaks) - shift[..., None])
    # An all -inf tile holds no mass; its factor may overflow, so it is dropped, not scaled.
    rescaled = torch.where(peaks == -math.inf, torch.zeros_like(rescaled), rescaled)
    total = torch.zeros_like(shift)
    for tile in range(peaks.shape[-1]):
        total = total + rescaled[..., tile]
    return total


def combine_tiles(peaks: torch.Tensor, masses: torch.Tensor) -> torch.Tensor:
    """The FP32 log normalizer [n] from tile statistics [n, tiles >= 1] in global tile order."""
    fast = native_reduction.combine_tiles(peaks, masses)
    return fast if fast is not None else torch_combine_tiles(peaks, masses)


def torch_combine_tiles(peaks: torch.Tensor, masses: torch.Tensor) -> torch.Tensor:
    """`combine_tiles` by torch operations: the recipe itself, on every device."""
    shift = _finite_or_zero(peaks.amax(dim=1))
    return shift + fp32_log(_rescaled_total(peaks, masses, shift))


def group_tiles(
    peaks: torch.Tensor, masses: torch.Tensor, size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tile statistics [n, tiles] with each run of `size` tiles (the last run may be shorter)
    made one (maximum, mass) pair, a tile statistic of the run's lanes: the run's maximum, and
    its tiles' masses rescaled to it and summed in order, as `combine_tiles` sums them.

    Size 1 returns the statistics themselves. A larger size rounds differently from combining
    the tiles one by one, so a normalizer of grouped statistics may differ in its last bits.
    """
    if size < 1:
        raise ValueError(f"a run of tiles has at least one tile, got {size}")
    count, tiles = peaks.shape
    if size == 1 or not tiles:
        return peaks, masses
    runs = -(-tiles // size)
    missing = runs * size - tiles
    # Padding tiles are all -inf: they raise no maximum and add no mass.
    peaks = torch.nn.functional.pad(peaks, (0, missing), value=-math.inf).view(count, runs, size)
    masses = torch.nn.functional.pad(masses, (0, missing), value=0.0).view(count, runs, size)
    top = peaks.amax(dim=2)
    return top, _rescaled_total(peaks, masses, _finite_or_zero(top))


def log_normalizer(rows: torch.Tensor) -> torch.Tensor:
    """FP32 log-sum-exp of each row by the shared tiled recipe; an all -inf row gives -inf."""
    fast = native_reduction.log_normalizer(rows, LSE_TILE)
    return fast if fast is not None else torch_combine_tiles(*torch_tile_statistics(rows))
