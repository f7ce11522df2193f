"""The compiled batch-invariant linear layer: one reduction order for every row count and width."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from adapters.gpu.model import native_gemm
from adapters.gpu.model.invariant import check_row_invariance, invariant_linear

WIDTHS = (1, 8, 16)  # the lane representations row_gemm.c builds; a CPU runs a prefix of them
# 100 outputs end in a partial tile of every width's OUT_TILE, 72 inputs in a partial vector.
OUTPUTS, INNER, ROWS = 100, 72, 70


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(torch.int32)


@pytest.fixture
def library() -> Iterator[object]:
    loaded = native_gemm.library()
    assert loaded is not None, "`make native` builds the library; the tests need it"
    widest = native_gemm.vector_width(0)
    yield loaded
    native_gemm.vector_width(widest)


def case(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(OUTPUTS, INNER, generator=generator) * 0.1
    bias = torch.randn(OUTPUTS, generator=generator)
    rows = torch.randn(ROWS, INNER, generator=generator)
    return rows, weight, bias


def test_a_row_has_the_same_bits_at_every_row_count_and_every_vector_width(library):
    rows, weight, bias = case(0)
    widest = native_gemm.vector_width(0)
    native_gemm.vector_width(1)
    alone = torch.cat([invariant_linear(rows[i : i + 1], weight, bias) for i in range(ROWS)])

    for width in (w for w in WIDTHS if w <= widest):
        assert native_gemm.vector_width(width) == width
        for count in (*range(1, 14), 33, ROWS):
            got = invariant_linear(rows[:count], weight, bias)
            assert torch.equal(bits(got), bits(alone[:count])), (width, count)


def test_the_kernel_is_the_linear_layer_within_float32_rounding(library):
    rows, weight, bias = case(1)
    exact = F.linear(rows.double(), weight.double(), bias.double())

    got = native_gemm.rows_times_weight(rows, weight, bias)

    assert got is not None and got.shape == (ROWS, OUTPUTS)
    assert torch.allclose(got.double(), exact, rtol=0, atol=1e-5)
    unbiased = native_gemm.rows_times_weight(rows, weight)
    assert unbiased is not None
    assert torch.allclose(unbiased.double(), exact - bias.double(), rtol=0, atol=1e-5)


def test_threads_split_the_outputs_without_moving_a_bit(library, monkeypatch):
    rows, weight, bias = case(2)
    before = torch.get_num_threads()
    alone = native_gemm.rows_times_weight(rows, weight, bias)
    monkeypatch.setattr(native_gemm, "_THREADED_WORK", 0)
    try:
        for threads in (2, 3):
            torch.set_num_threads(threads)
            assert len(native_gemm._shares(OUTPUTS, 1)) == threads
            split = native_gemm.rows_times_weight(rows, weight, bias)
            assert split is not None and alone is not None
            assert torch.equal(bits(split), bits(alone)), threads
    finally:
        torch.set_num_threads(before)


def test_strided_rows_and_weights_read_only_their_own_lanes(library):
    rows, weight, bias = case(3)
    wide_rows = torch.randn(ROWS, INNER + 24)
    wide_rows[:, 8 : 8 + INNER] = rows
    wide_weight = torch.full((OUTPUTS, INNER + 8), float("nan"))
    wide_weight[:, :INNER] = weight

    got = invariant_linear(wide_rows[:, 8 : 8 + INNER], wide_weight[:, :INNER], bias)

    assert torch.equal(bits(got), bits(invariant_linear(rows, weight, bias)))


def test_without_the_library_the_padded_gemm_serves_and_the_probe_still_holds(monkeypatch):
    rows, weight, bias = case(4)
    monkeypatch.setattr(native_gemm, "library", lambda: None)

    assert native_gemm.rows_times_weight(rows, weight, bias) is None
    padded = torch.zeros(8, INNER)
    padded[:5] = rows[:5]
    assert torch.equal(invariant_linear(rows[:5], weight, bias), F.linear(padded, weight, bias)[:5])
    check_row_invariance([weight])


def test_other_dtypes_take_the_padded_gemm(library):
    rows, weight, bias = case(5)
    half_rows, half_weight = rows.to(torch.bfloat16), weight.to(torch.bfloat16)

    assert not native_gemm.applies(half_weight)
    assert native_gemm.rows_times_weight(half_rows, half_weight) is None
    assert invariant_linear(half_rows[:3], half_weight).dtype == torch.bfloat16
