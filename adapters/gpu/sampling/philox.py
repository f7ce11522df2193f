"""Philox4x32-10 counter-based random numbers, vectorised in torch on any device."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

_MASK32 = 0xFFFFFFFF
_MULTIPLIER_0 = 0xD2511F53
_MULTIPLIER_1 = 0xCD9E8D57
_KEY_BUMP_0 = 0x9E3779B9
_KEY_BUMP_1 = 0xBB67AE85
_ROUNDS = 10
_WORDS_PER_BLOCK = 4
# 23 random bits give floats (2k + 1) / 2**24 that float32 holds exactly, so 0 and 1 never occur.
_UNIFORM_SHIFT = 9
_UNIFORM_STEP = 2.0**-23
_UNIFORM_OFFSET = 2.0**-24


def _mulhilo(multiplier: int, word: Tensor) -> tuple[Tensor, Tensor]:
    """High and low 32-bit halves of `multiplier * word` without overflowing int64."""
    # The full 64-bit product does not fit a signed int64, so multiply by 16-bit halves.
    product_low = word * (multiplier & 0xFFFF)
    product_high = word * (multiplier >> 16)
    partial = product_low + ((product_high & 0xFFFF) << 16)
    return (product_high >> 16) + (partial >> 32), partial & _MASK32


def philox4x32_10(
    counter: Sequence[Tensor | int], key: Sequence[Tensor | int]
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Philox4x32-10 of a 4-word counter under a 2-word key, element-wise over broadcast shapes.

    Words are int64 tensors (or ints) holding values in [0, 2**32); the four output words are
    int64 tensors in the same range, shaped as the broadcast of all inputs.
    """
    if len(counter) != 4 or len(key) != 2:
        raise ValueError("Philox4x32 takes a 4-word counter and a 2-word key")
    device = next((w.device for w in (*counter, *key) if isinstance(w, Tensor)), None)
    c0, c1, c2, c3 = (torch.as_tensor(w, dtype=torch.int64, device=device) for w in counter)
    k0, k1 = (torch.as_tensor(w, dtype=torch.int64, device=device) for w in key)
    for round_index in range(_ROUNDS):
        if round_index:
            k0 = (k0 + _KEY_BUMP_0) & _MASK32
            k1 = (k1 + _KEY_BUMP_1) & _MASK32
        high0, low0 = _mulhilo(_MULTIPLIER_0, c0)
        high1, low1 = _mulhilo(_MULTIPLIER_1, c2)
        c0, c1, c2, c3 = high1 ^ c1 ^ k0, low1, high0 ^ c3 ^ k1, low0
    shape = torch.broadcast_shapes(c0.shape, c1.shape, c2.shape, c3.shape)
    return tuple(w.expand(shape) for w in (c0, c1, c2, c3))  # type: ignore[return-value]


def philox_uniform(
    seeds: Tensor,
    counters: Tensor,
    width: int,
    streams: Tensor | int = 0,
    first_column: int = 0,
) -> Tensor:
    """Uniform float32 noise in (0, 1), [R, width], a pure function of each row's seed, counter
    and stream.

    Column v of row r is word v % 4 of Philox4x32-10 with key = (low, high) 32-bit words of
    seeds[r] and counter = (low, high words of counters[r], v // 4, streams[r]); so a row's
    noise never depends on the other rows of the batch, and draws made for different purposes
    at one position (`streams`, an int or an int64 [R]) never share noise. The result holds
    columns [first_column, first_column + width): a vocabulary shard draws exactly the noise
    its token IDs get in the whole row.
    """
    if seeds.dim() != 1 or counters.shape != seeds.shape:
        raise ValueError("seeds and counters must be 1-D tensors of the same length")
    if seeds.dtype != torch.int64 or counters.dtype != torch.int64:
        raise TypeError("seeds and counters must be int64")
    if width < 0 or first_column < 0:
        raise ValueError(f"width and first_column must be >= 0, got {width}, {first_column}")
    skipped, lead = divmod(first_column, _WORDS_PER_BLOCK)
    blocks = -(-(lead + width) // _WORDS_PER_BLOCK)
    seeds = seeds.unsqueeze(1)
    counters = counters.unsqueeze(1)
    if isinstance(streams, Tensor):
        streams = streams.unsqueeze(1)
    block_index = torch.arange(
        skipped, skipped + blocks, dtype=torch.int64, device=seeds.device
    ).unsqueeze(0)
    words = philox4x32_10(
        (counters & _MASK32, (counters >> 32) & _MASK32, block_index, streams),
        (seeds & _MASK32, (seeds >> 32) & _MASK32),
    )
    bits = torch.stack(words, dim=-1).reshape(seeds.shape[0], blocks * _WORDS_PER_BLOCK)
    return uniform_from_bits(bits[:, lead : lead + width])


def uniform_from_bits(bits: Tensor) -> Tensor:
    """float32 in (0, 1), never 0 nor 1, from int64 tensors of 32-bit words."""
    return (bits >> _UNIFORM_SHIFT).to(torch.float32).mul_(_UNIFORM_STEP).add_(_UNIFORM_OFFSET)
