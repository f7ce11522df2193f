"""Batch-invariant kernels: a row's result depends on that row's inputs, never on its neighbours.

Measured on the CPU (MKL sgemm, torch 2.13, AVX-512, 1 and 2 threads): a GEMM's row keeps its
bits whatever the row count as long as that count is a multiple of 4. With 1 to 3 rows MKL
takes other kernels (a matrix-vector path) that reduce in another order, and with 2 threads it
splits 5 to 11 rows into per-thread pieces that hit those kernels; this is where batch 1 and
batch N differ by up to 3e-5 on SmolLM2. So every matmul here gets a multiple of
`GEMM_ROW_GRANULE` rows (zero padding), and its reduction dimension is fixed by the model
(hidden, inner, head size, `KEY_BLOCK`), never by the batch. Attention reduces each query's keys
in blocks of `KEY_BLOCK` positions counted from position 0, combined in block order, so a query
sees the same sums whether its keys came in one chunk or many, in a decode row or a
verification chunk, next to short or long neighbours.

Linear layers with CPU FP32 weights take a compiled kernel instead (`native_gemm`, made by
`make native`): it reduces every output in one fixed order of its own, so it needs no padding
and a decode step of one row costs a matrix-vector product, not a 4-row GEMM. Its attention
kernel scores a query's keys with the same dot products and adds the visible keys in position
order, one pass where the torch blocks below take a dozen small operations.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F

from adapters.gpu.model import native_gemm

# Every GEMM's row count is a multiple of this (measured: see the module docstring).
GEMM_ROW_GRANULE = 4
# Keys per attention block: a multiple of every vector width, so no key takes a scalar tail.
KEY_BLOCK = 64


def invariant_linear(
    rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """`rows @ weight.T + bias` [N, out] computed alike for every row count N.

    CPU FP32 weights take the compiled fixed-order kernel (`native_gemm`) when it is built; the
    rest, and every weight when it is not, the zero-padded GEMM. Which one depends on the
    weight's dtype and device, so every row of a model takes the same one."""
    native = native_gemm.rows_times_weight(rows, weight, bias)
    if native is not None:
        return native
    count = rows.shape[0]
    if count and count % GEMM_ROW_GRANULE == 0:
        return F.linear(rows.contiguous(), weight, bias)
    padded = rows.new_zeros((_granules(count), rows.shape[1]))
    padded[:count] = rows
    return F.linear(padded, weight, bias)[:count]


# Row counts the start-up probe runs: each small count MKL was seen to split or treat apart,
# a few larger ones, all against the same rows inside one 64-row call.
_PROBED_COUNTS = (1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 17, 33)
_PROBE_ROWS = 64


class RowInvarianceError(RuntimeError):
    """This machine's GEMMs give a row different bits for different row counts."""


def check_row_invariance(weights: Iterable[torch.Tensor]) -> None:
    """Raises RowInvarianceError unless `invariant_linear` gives every probed row count the
    bits the same rows get inside a 64-row call, for each of `weights` [out, in], at this
    process's thread count. The padded GEMM's property is measured, not promised by the BLAS,
    so a server checks it before it promises bits; the compiled kernel holds it by
    construction, and the probe checks that the library loaded is that kernel."""
    generator = torch.Generator().manual_seed(0)
    for weight in weights:
        rows = torch.randn(_PROBE_ROWS, weight.shape[1], generator=generator)
        rows = rows.to(dtype=weight.dtype, device=weight.device)
        reference = invariant_linear(rows, weight)
        for count in _PROBED_COUNTS:
            if not torch.equal(invariant_linear(rows[:count], weight), reference[:count]):
                raise RowInvarianceError(
                    f"batch-invariant mode: a GEMM of shape {tuple(weight.shape)} gives {count} "
                    f"rows other bits than {_PROBE_ROWS} rows at {torch.get_num_threads()} "
                    f"threads on this machine; try another thread count (OMP_NUM_THREADS)"
                )


def blocked_attention(
    queries: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    kv_slots: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Attention of folded queries [S, kv_heads, R, head_dim] over the cache rows `kv_slots`
    [S, L] (position j of sequence s at kv_slots[s, j]) under `mask` [S, 1, R or 1, L]
    (True: visible). Returns [S, kv_heads, R, head_dim].

    Two passes over key blocks: the maximum score (exact in any order), then per block the
    exponentials' sum and their product with the values (matmuls of fixed shape), added block
    after block. Masked keys weigh exactly zero, so blocks past a query's last key, and keys
    past it inside its block, change none of its bits. With the compiled library, CPU FP32
    caches take its kernel instead (`native_gemm.attention`): the same contract in one pass
    per query row, keys added one by one in position order.
    """
    native = native_gemm.attention(queries, (key_cache, value_cache), kv_slots, mask, scale)
    if native is not None:
        return native
    count, heads, rows, head_dim = queries.shape
    width = kv_slots.shape[1]
    blocks = -(-width // KEY_BLOCK)
    padding = blocks * KEY_BLOCK - width
    if padding:
        kv_slots = F.pad(kv_slots, (0, padding))  # padding reads row 0, masked below
        mask = F.pad(mask, (0, padding), value=False)
    padded_rows = _granules(rows)
    if padded_rows != rows:
        queries = F.pad(queries, (0, 0, 0, padded_rows - rows))
        if mask.shape[2] != 1:
            # Zero queries over visible keys: finite scores, results dropped below.
            mask = F.pad(mask, (0, 0, 0, padded_rows - rows), value=True)
    keys = _blocks(key_cache, kv_slots, blocks)  # [S, H, blocks, KEY_BLOCK, D]
    values = _blocks(value_cache, kv_slots, blocks)
    visible = mask.view(count, 1, mask.shape[2], blocks, KEY_BLOCK).transpose(2, 3)
    scores = torch.matmul(queries[:, :, None], keys.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~visible, float("-inf"))  # [S, H, blocks, R', KEY_BLOCK]
    top = scores.amax(dim=(2, 4), keepdim=True)
    weights = torch.exp(scores - top)
    totals = weights.sum(dim=-1).cumsum(dim=2)[:, :, -1]  # [S, H, R']
    weighted = torch.matmul(weights, values).cumsum(dim=2)[:, :, -1]  # [S, H, R', D]
    out = weighted / totals[..., None]
    return out[:, :, :rows]


def _granules(rows: int) -> int:
    """`rows` rounded up to a positive multiple of GEMM_ROW_GRANULE."""
    return max(1, -(-rows // GEMM_ROW_GRANULE)) * GEMM_ROW_GRANULE


def _blocks(cache: torch.Tensor, slots: torch.Tensor, blocks: int) -> torch.Tensor:
    """Cache rows `slots` [S, blocks * KEY_BLOCK] as [S, kv_heads, blocks, KEY_BLOCK, head_dim]."""
    count = slots.shape[0]
    rows = cache.index_select(0, slots.flatten())
    shaped = rows.view(count, blocks, KEY_BLOCK, *cache.shape[1:])
    return shaped.permute(0, 3, 1, 2, 4)
