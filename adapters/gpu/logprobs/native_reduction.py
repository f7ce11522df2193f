"""The compiled CPU reduction (native/reduction.c) through ctypes, when `make` has built it.

PERF: the torch recipe of normalizer.py makes two dozen passes over every row (the exp
polynomial is one torch operation a step) and combines tiles in a Python loop of one torch add
per tile: ~0.9 ms per 49,152-entry row on the 2-core dev box. The C file makes one pass per
tile with the same FP32 operations in the same order: ~0.04 ms a row. Torch cannot fuse the
passes on the CPU, and at one pass per operation the tile statistics alone stay above 0.1 ms a
row; docs/performance.md has the measurements and the choice of ctypes.

Each function here returns None where the caller must use the torch recipe instead: the
library is missing or switched off (HELIOS_NATIVE_REDUCTION=0), the tensors are not CPU FP32
rows with unit lane stride, or the input holds what only torch decides bit for bit (a NaN, a
zero maximum of both signs).
"""

from __future__ import annotations

from pathlib import Path

import torch

from adapters.gpu.native_library import INT, INT64, POINTER, Signature, cached_loader

LIBRARY = Path(__file__).with_name("native") / "libhelios_reduction.so"
SWITCH = "HELIOS_NATIVE_REDUCTION"  # "0" keeps every reduction on the torch recipe
MAX_TOP_KEYS = 64  # reduction.c's MAX_TOP


# The exported functions: argument types (each kernel's leading ones: rows, row count, lanes a
# row, row stride), result type.
_SIGNATURES: dict[str, Signature] = {
    "helios_tile_statistics": ([POINTER, INT64, INT64, INT64, POINTER, POINTER], INT),
    "helios_combine_tiles": ([POINTER, POINTER, INT64, INT64, POINTER], INT),
    "helios_log_normalizer": ([POINTER, INT64, INT64, INT64, POINTER], INT),
    "helios_top_keys": ([POINTER, INT64, INT64, INT64, INT64, POINTER], INT),
    "helios_top_keys_shifted": ([POINTER, INT64, INT64, INT64, POINTER, INT64, POINTER], INT),
    "helios_count_greater": ([POINTER, INT64, INT64, INT64, POINTER, POINTER], None),
    "helios_vector_width": ([INT], INT),
}

# The loaded library, or None when it is switched off or was not built.
library = cached_loader(LIBRARY, SWITCH, _SIGNATURES)


def _rows(tensor: torch.Tensor) -> bool:
    """Whether `tensor` is CPU FP32 [n, width >= 1] with contiguous lanes in each row."""
    return (
        tensor.device.type == "cpu"
        and tensor.dtype == torch.float32
        and tensor.dim() == 2
        and tensor.shape[1] >= 1
        and (tensor.stride(1) == 1 or tensor.shape[1] == 1)
        and not tensor.requires_grad
    )


def tile_statistics(rows: torch.Tensor, tile: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """normalizer.tile_statistics of `rows` [n, V]: peaks and masses [n, ceil(V / tile)]."""
    native = library()
    if native is None or not _rows(rows) or tile != 1024:
        return None
    count, vocab = rows.shape
    tiles = -(-vocab // tile)
    peaks = rows.new_empty(count, tiles)
    masses = rows.new_empty(count, tiles)
    if count:
        stride = rows.stride(0)
        failed = native.helios_tile_statistics(
            rows.data_ptr(), count, vocab, stride, peaks.data_ptr(), masses.data_ptr()
        )
        if failed:
            return None
    return peaks, masses


def log_normalizer(rows: torch.Tensor, tile: int) -> torch.Tensor | None:
    """normalizer.log_normalizer of `rows` [n, V]: tile statistics and their combination [n]."""
    native = library()
    if native is None or not _rows(rows) or tile != 1024:
        return None
    count, vocab = rows.shape
    normalizers = rows.new_empty(count)
    if count:
        args = (rows.data_ptr(), count, vocab, rows.stride(0), normalizers.data_ptr())
        if native.helios_log_normalizer(*args):
            return None
    return normalizers


def combine_tiles(peaks: torch.Tensor, masses: torch.Tensor) -> torch.Tensor | None:
    """normalizer.combine_tiles: the log normalizer [n] from tile statistics [n, tiles]."""
    native = library()
    if native is None or peaks.device.type != "cpu" or peaks.shape != masses.shape:
        return None
    # Exchanged statistics arrive interleaved (peak, mass); a copy of a few tiles is cheap.
    peaks, masses = peaks.contiguous(), masses.contiguous()
    if not (_rows(peaks) and _rows(masses)):
        return None
    count, tiles = peaks.shape
    normalizers = peaks.new_empty(count)
    if count:
        args = (peaks.data_ptr(), masses.data_ptr(), count, tiles, normalizers.data_ptr())
        if native.helios_combine_tiles(*args):
            return None
    return normalizers


def top_sort_keys(
    values: torch.Tensor, k: int, shifts: torch.Tensor | None = None
) -> torch.Tensor | None:
    """keys.top_sort_keys: the k largest sort keys of each row of `values`, descending; with
    `shifts` [n], those of `values - shifts[:, None]` (FP32 subtractions), never written out."""
    native = library()
    if native is None or not _rows(values) or not 1 <= k <= min(MAX_TOP_KEYS, values.shape[1]):
        return None
    count, width = values.shape
    if shifts is not None:
        if shifts.shape != (count,) or shifts.dtype != torch.float32:
            return None
        if shifts.device.type != "cpu":
            return None
        shifts = shifts.contiguous()
    keys = torch.empty(count, k, dtype=torch.int64)
    if count:
        head = (values.data_ptr(), count, width, values.stride(0))
        if shifts is None:
            failed = native.helios_top_keys(*head, k, keys.data_ptr())
        else:
            failed = native.helios_top_keys_shifted(*head, shifts.data_ptr(), k, keys.data_ptr())
        if failed:
            return None
    return keys


def count_greater(values: torch.Tensor, pivots: torch.Tensor) -> torch.Tensor | None:
    """int32 [n]: how many lanes of each row of `values` [n, V] exceed its FP32 pivot [n]."""
    native = library()
    if native is None or not _rows(values) or pivots.shape != (values.shape[0],):
        return None
    if pivots.dtype != torch.float32 or pivots.device.type != "cpu":
        return None
    pivots = pivots.contiguous()
    count, width = values.shape
    counts = torch.empty(count, dtype=torch.int32)
    if count:
        native.helios_count_greater(
            values.data_ptr(), count, width, values.stride(0), pivots.data_ptr(), counts.data_ptr()
        )
    return counts
