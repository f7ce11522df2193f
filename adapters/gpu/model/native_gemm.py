"""The compiled batch-invariant linear layer (native/row_gemm.c) through ctypes, when built.

PERF: the padded MKL GEMM of `invariant.py` runs 4 rows where a decode step of one request has
one, about 1.7x a matrix-vector product at batch 1 (docs/batch-invariance.md). The C kernel
reduces every output in a fixed order of its own, so it needs no padding: one row streams the
weights once, as a matrix-vector product does. Threads split the outputs, never a reduction.

`rows_times_weight` returns None where the caller must use the padded GEMM instead: the
library is missing or switched off (HELIOS_NATIVE_GEMM=0), or the tensors are not CPU FP32.
That choice depends on the model's dtype and device only, never on the row count, so a process
runs one kernel for every row of a model.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from adapters.gpu.native_library import FLOAT, INT, INT64, POINTER, Signature, cached_loader

LIBRARY = Path(__file__).with_name("native") / "libhelios_gemm.so"
SWITCH = "HELIOS_NATIVE_GEMM"  # "0" keeps every invariant linear layer on the padded GEMM
OUT_TILE = 6  # outputs a helper thread's share is rounded to (row_gemm.c's widest OUT_TILE)
# Multiply-adds below which one thread runs the call: a handoff to a helper costs tens of
# microseconds, more than a small call saves (decode steps of a few rows stream weights that
# one core reads about as fast as two).
_THREADED_WORK = 1 << 24


# The exported functions: argument types, result type.
_SIGNATURES: dict[str, Signature] = {
    "helios_rows_times_weight": (
        [
            *(POINTER, INT64, INT64, INT64),  # rows, count, inner, row stride
            *(POINTER, INT64, POINTER),  # weight, weight stride, bias (or NULL)
            *(INT64, INT64, POINTER, INT64),  # outputs [first, stop), out, out stride
        ],
        INT,
    ),
    "helios_invariant_attention": (
        [
            *(POINTER, INT64, INT64, INT64),  # queries, heads, rows, dim
            *(POINTER, POINTER, POINTER, INT64),  # key cache, value cache, slots, width
            *(POINTER, INT64, INT64, INT64),  # mask and its strides: sequence, row, key
            *(FLOAT, INT64, INT64, POINTER),  # scale, units [first, stop), out
        ],
        INT,
    ),
    "helios_gemm_width": ([INT], INT),
}

# The loaded library, or None when it is switched off or was not built.
library = cached_loader(LIBRARY, SWITCH, _SIGNATURES)


def applies(weight: torch.Tensor) -> bool:
    """Whether the kernel serves linear layers with `weight` (CPU FP32, library built)."""
    return (
        library() is not None
        and weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and weight.dim() == 2
    )


def rows_times_weight(
    rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor | None:
    """`rows @ weight.T + bias` [N, out] in the kernel's fixed order, or None (see module)."""
    native = library()
    if native is None or not applies(weight) or rows.dtype != torch.float32:
        return None
    if rows.device.type != "cpu" or rows.dim() != 2 or rows.shape[1] != weight.shape[1]:
        return None
    if bias is not None and (bias.dtype != torch.float32 or bias.device.type != "cpu"):
        return None
    rows = rows if rows.stride(-1) == 1 else rows.contiguous()
    weight = weight if weight.stride(-1) == 1 else weight.contiguous()
    bias = None if bias is None else bias.contiguous()
    count, inner = rows.shape
    outputs = weight.shape[0]
    out = rows.new_empty(count, outputs)
    if count == 0 or outputs == 0:
        return out
    common: tuple[int | float | None, ...] = (rows.data_ptr(), count, inner, max(rows.stride(0), 1))
    common += (weight.data_ptr(), max(weight.stride(0), 1))
    common += (None if bias is None else bias.data_ptr(),)
    shares = _shares(outputs, count * outputs * inner)
    if len(shares) == 1:
        native.helios_rows_times_weight(*common, 0, outputs, out.data_ptr(), outputs)
        return out
    pending: list[Future[int]] = [
        _pool(len(shares) - 1).submit(
            native.helios_rows_times_weight, *common, first, stop, out.data_ptr(), outputs
        )
        for first, stop in shares[1:]
    ]
    first, stop = shares[0]
    native.helios_rows_times_weight(*common, first, stop, out.data_ptr(), outputs)
    for done in pending:
        done.result()
    return out


def attention(
    queries: torch.Tensor,
    caches: tuple[torch.Tensor, torch.Tensor],
    kv_slots: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
) -> torch.Tensor | None:
    """invariant.blocked_attention in the kernel's fixed order (row_gemm.c's
    helios_invariant_attention) over the layer's (key, value) caches, or None where the torch
    blocks must serve (see module)."""
    key_cache, value_cache = caches
    native = library()
    if native is None or not applies(key_cache.flatten(1)) or queries.dtype != torch.float32:
        return None
    if value_cache.dtype != torch.float32 or value_cache.device.type != "cpu":
        return None
    count, heads, rows, dim = queries.shape
    width = kv_slots.shape[1]
    if mask.dtype != torch.bool or mask.shape[0] != count or mask.shape[3] != width:
        return None
    queries, kv_slots = queries.contiguous(), kv_slots.to(torch.int64).contiguous()
    key_cache, value_cache = key_cache.contiguous(), value_cache.contiguous()
    out = queries.new_empty(count, heads, rows, dim)
    units = count * heads
    if units == 0 or rows == 0:
        return out
    mask_row = mask.stride(2) if mask.shape[2] == rows else 0
    common: tuple[int | float, ...] = (queries.data_ptr(), heads, rows, dim)
    common += (key_cache.data_ptr(), value_cache.data_ptr())
    common += (kv_slots.data_ptr(), width, mask.data_ptr(), mask.stride(0), mask_row)
    common += (mask.stride(3), scale)
    shares = _shares(units, units * rows * width * dim * 2, 1)
    failed = 0
    pending: list[Future[int]] = [
        _pool(len(shares) - 1).submit(
            native.helios_invariant_attention, *common, first, stop, out.data_ptr()
        )
        for first, stop in shares[1:]
    ]
    first, stop = shares[0]
    failed += native.helios_invariant_attention(*common, first, stop, out.data_ptr())
    for done in pending:
        failed += done.result()
    if failed:
        raise MemoryError("batch-invariant attention: no scratch memory for the scores")
    return out


def _shares(outputs: int, work: int, granule: int = OUT_TILE) -> list[tuple[int, int]]:
    """Ranges [first, stop) of `outputs`, one a thread in multiples of `granule`: torch's
    thread count for large calls, one thread below _THREADED_WORK multiply-adds."""
    tiles = -(-outputs // granule)
    threads = min(torch.get_num_threads(), tiles)
    if threads <= 1 or work < _THREADED_WORK:
        return [(0, outputs)]
    bounds = [min(outputs, (tiles * t // threads) * granule) for t in range(threads + 1)]
    return [(bounds[t], bounds[t + 1]) for t in range(threads) if bounds[t] < bounds[t + 1]]


_POOL_LOCK = threading.Lock()
_POOLS: dict[int, ThreadPoolExecutor] = {}


def _pool(helpers: int) -> ThreadPoolExecutor:
    """A process-wide pool of `helpers` threads (created on first use)."""
    with _POOL_LOCK:
        pool = _POOLS.get(helpers)
        if pool is None:
            pool = ThreadPoolExecutor(helpers, thread_name_prefix="helios-gemm")
            _POOLS[helpers] = pool
        return pool


def vector_width(wanted: int = 0) -> int:
    """The kernel's lane width: 16 (AVX-512), 8 (AVX2) or 1; `wanted` picks one (tests)."""
    native = library()
    if native is None:
        raise RuntimeError("the native GEMM library is not built (make native)")
    return int(native.helios_gemm_width(wanted))
