"""The compiled CPU reduction equals the torch recipe bit for bit, at every vector width."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import pytest
import torch

from adapters.gpu.logprobs import native_reduction
from adapters.gpu.logprobs.keys import greater_counts, top_sort_keys, torch_top_sort_keys
from adapters.gpu.logprobs.normalizer import (
    LSE_TILE,
    combine_tiles,
    log_normalizer,
    tile_statistics,
    torch_combine_tiles,
    torch_tile_statistics,
)
from adapters.gpu.logprobs.reducer import ReductionInputs
from adapters.gpu.logprobs.reference_reducer import ReferenceLogprobReducer
from adapters.gpu.scoring.prompt_scorer import PromptScorer
from domain.logprobs.prompt_scores import PROMPT_ROW_WORDS
from domain.logprobs.values import MAX_SELECTED_IDS, NATURAL_TOP_K

VOCABS = (1, 7, 1023, 1024, 1025, 49_152, 151_936)  # 151,936 is 148.375 tiles
WIDTHS = (4, 8, 16)  # the kernel widths reduction.c builds; a CPU runs a prefix of them


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(torch.int32) if tensor.dtype == torch.float32 else tensor


def assert_same_bits(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.equal(bits(got), bits(want)), (got, want)


@pytest.fixture(params=WIDTHS, ids=lambda width: f"width{width}")
def width(request: pytest.FixtureRequest) -> Iterator[int]:
    """Runs the kernels at the requested width, or at the widest this CPU has below it."""
    library = native_reduction.library()
    assert library is not None, "`make native` builds the library; the tests need it"
    widest = library.helios_vector_width(0)
    running = library.helios_vector_width(request.param)
    assert running == min(request.param, widest)
    yield running
    library.helios_vector_width(widest)


def random_rows(vocab: int, seed: int) -> list[tuple[str, torch.Tensor]]:
    """Named [rows, vocab] FP32 cases: spreads, ties and every extreme a logit row can hold."""
    generator = torch.Generator().manual_seed(seed)

    def normal(rows: int = 2, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(rows, vocab, generator=generator) * scale

    some_minus_inf = normal(2, 4.0)
    some_minus_inf[0, ::3] = -math.inf
    some_minus_inf[1, : min(vocab, 2 * LSE_TILE)] = -math.inf  # whole tiles hold no mass
    plus_inf = normal(2, 4.0)
    plus_inf[0, vocab // 2] = math.inf
    plus_inf[1, ::5] = math.inf
    extremes = normal(2, 3e38).clamp(-3.4e38, 3.4e38)
    extremes[1, vocab - 1] = -3.4e38
    negative_zero_max = -normal(2).abs()
    negative_zero_max[:, vocab // 3] = -0.0
    # One lane far above the rest: every other value rounds to the same -lse, ties the
    # subtraction makes out of distinct logits.
    towering = normal(2)
    towering[:, vocab // 2] = 1e9
    return [
        ("normal", normal()),
        ("wide", normal(2, 40.0)),
        ("narrow", normal(2, 1e-3)),
        ("past the exp range", normal(2, 200.0)),
        ("ties", normal(2, 2.0).round()),
        ("one value", torch.full((2, vocab), 88.5)),
        ("all -inf", torch.full((2, vocab), -math.inf)),
        ("some -inf", some_minus_inf),
        ("+inf lanes", plus_inf),
        ("huge finite", extremes),
        ("subnormal", normal(2, 1e-40)),
        ("+0.0 everywhere", torch.zeros(2, vocab)),
        ("-0.0 maximum", negative_zero_max),
        ("one towering lane", towering),
    ]


class Case:
    """One named row block and what the torch recipe makes of it, computed once per module."""

    def __init__(self, name: str, rows: torch.Tensor) -> None:
        self.name, self.rows = name, rows
        self.peaks, self.masses = torch_tile_statistics(rows)
        self.normalizer = torch_combine_tiles(self.peaks, self.masses)
        self.values = rows - self.normalizer[:, None]
        self.ranked = not torch.isnan(self.values).any()  # NaN rows are the fallback's
        width = rows.shape[1]
        ks = sorted({1, min(NATURAL_TOP_K, width), min(native_reduction.MAX_TOP_KEYS, width)})
        self.keys = {k: torch_top_sort_keys(self.values, k) for k in ks} if self.ranked else {}
        self.pivots = self.values[:, -1].clone()
        self.pivots[0] = math.nan  # nothing exceeds NaN
        self.counts = (self.values > self.pivots[:, None]).sum(dim=1, dtype=torch.int32)


@pytest.fixture(scope="module")
def cases() -> list[Case]:
    return [
        Case(f"{name}, V={vocab}", rows)
        for vocab in VOCABS
        for name, rows in random_rows(vocab, seed=vocab)
    ]


def test_tile_statistics_and_the_normalizer_equal_the_torch_recipe_bit_for_bit(
    cases: list[Case], width: int
) -> None:
    for case in cases:
        fast = native_reduction.tile_statistics(case.rows, LSE_TILE)
        assert fast is not None, case.name
        assert_same_bits(fast[0], case.peaks)
        assert_same_bits(fast[1], case.masses)
        combined = native_reduction.combine_tiles(case.peaks, case.masses)
        assert combined is not None, case.name
        assert_same_bits(combined, case.normalizer)
        fused = native_reduction.log_normalizer(case.rows, LSE_TILE)
        assert fused is not None, case.name
        assert_same_bits(fused, case.normalizer)


def test_top_sort_keys_and_greater_counts_equal_the_torch_ones(
    cases: list[Case], width: int
) -> None:
    assert sum(case.ranked for case in cases) > len(cases) // 2
    for case in cases:
        for k, keys in case.keys.items():
            fast = native_reduction.top_sort_keys(case.values, k)
            assert fast is not None, case.name
            assert_same_bits(fast, keys)
        counts = native_reduction.count_greater(case.values, case.pivots)
        assert counts is not None
        assert_same_bits(counts, case.counts)


def test_top_keys_of_logits_shifted_by_their_normalizers_are_the_values_keys(
    cases: list[Case], width: int
) -> None:
    """The reducer ranks `logits - lse` without writing it: the compiled kernel subtracts as it
    reads, and a row it declines (a NaN value) gets the torch keys of the written values."""
    for case in cases:
        for k in sorted({1, min(NATURAL_TOP_K, case.rows.shape[1])}):
            want = case.keys.get(k)
            if want is None:
                want = torch_top_sort_keys(case.values, k)
            fast = native_reduction.top_sort_keys(case.rows, k, case.normalizer)
            assert (fast is not None) == case.ranked, case.name
            if fast is not None:
                assert_same_bits(fast, want)
            assert_same_bits(top_sort_keys(case.rows, k, case.normalizer), want)


def test_rows_only_torch_decides_fall_back_to_it_with_the_same_bits(width) -> None:
    generator = torch.Generator().manual_seed(11)
    nan = torch.randn(3, 5000, generator=generator)
    nan[1, 4321] = math.nan
    mixed_zero_max = -1.0 - torch.rand(2, 3000, generator=generator)
    mixed_zero_max[:, 7], mixed_zero_max[:, 900] = -0.0, 0.0  # one tile, +0.0 and -0.0 at top
    mixed_tile_peaks = -1.0 - torch.rand(2, 3000, generator=generator)
    mixed_tile_peaks[:, 7], mixed_tile_peaks[:, 2000] = -0.0, 0.0  # tile peaks -0.0 and +0.0
    values_with_nan = torch.randn(2, 3000, generator=generator)
    values_with_nan[0, 17] = math.nan
    assert native_reduction.tile_statistics(nan, LSE_TILE) is None
    assert native_reduction.tile_statistics(mixed_zero_max, LSE_TILE) is None
    assert native_reduction.combine_tiles(*torch_tile_statistics(mixed_tile_peaks)) is None
    assert native_reduction.top_sort_keys(values_with_nan, NATURAL_TOP_K) is None
    for rows in (nan, mixed_zero_max, mixed_tile_peaks):
        peaks, masses = torch_tile_statistics(rows)
        assert_same_bits(tile_statistics(rows)[0], peaks)
        assert_same_bits(tile_statistics(rows)[1], masses)
        assert_same_bits(combine_tiles(peaks, masses), torch_combine_tiles(peaks, masses))
        assert_same_bits(log_normalizer(rows), torch_combine_tiles(peaks, masses))
    for values in (values_with_nan, torch.full((2, 40), math.nan)):
        keys = torch_top_sort_keys(values, NATURAL_TOP_K)
        assert_same_bits(top_sort_keys(values, NATURAL_TOP_K), keys)


def test_strided_rows_and_a_single_lane_vocabulary_read_only_their_own_lanes(width) -> None:
    block = torch.randn(5, 9000, generator=torch.Generator().manual_seed(12))
    rows = block[1:4, 100:8100]  # row starts 9,000 lanes apart, first lane at 100
    assert rows.stride() == (9000, 1)
    assert_same_bits(log_normalizer(rows), torch_combine_tiles(*torch_tile_statistics(rows)))
    values = (block * 0.5)[1:4, 100:8100]
    assert native_reduction.top_sort_keys(values, 20) is not None
    assert_same_bits(top_sort_keys(values, 20), torch_top_sort_keys(values, 20))
    # Statistics as the vocabulary-parallel reducers exchange them: (peak, mass) interleaved.
    pairs = torch.stack(torch_tile_statistics(rows), dim=2)
    combined = native_reduction.combine_tiles(pairs[:, :, 0], pairs[:, :, 1])
    assert combined is not None
    assert_same_bits(combined, torch_combine_tiles(pairs[:, :, 0], pairs[:, :, 1]))
    single = torch.tensor([[3.5], [-math.inf], [0.0], [-0.0], [math.inf]])
    normalizer = torch_combine_tiles(*torch_tile_statistics(single))
    assert_same_bits(log_normalizer(single), normalizer)
    values = (single - normalizer[:, None])[[0, 2, 3]]
    assert native_reduction.top_sort_keys(values, 1) is not None
    assert_same_bits(top_sort_keys(values, 1), torch_top_sort_keys(values, 1))


def test_the_public_functions_take_the_compiled_path_on_cpu_rows(monkeypatch) -> None:
    rows = torch.randn(2, 3000)
    calls: list[str] = []
    for name in ("tile_statistics", "log_normalizer", "top_sort_keys", "count_greater"):
        monkeypatch.setattr(native_reduction, name, recording(name, calls))
    tile_statistics(rows)
    log_normalizer(rows)
    top_sort_keys(rows, 20)
    greater_counts(rows, rows[:, 0])
    assert calls == ["tile_statistics", "log_normalizer", "top_sort_keys", "count_greater"]


def recording(name: str, calls: list[str]) -> Callable[..., object]:
    original = getattr(native_reduction, name)

    def call(*args: object) -> object:
        calls.append(name)
        result = original(*args)
        assert result is not None
        return result

    return call


def without_native(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native_reduction, "library", lambda: None)


@pytest.mark.parametrize("vocab", [3000, 49_152])
def test_the_reference_reducer_writes_the_same_words_without_the_compiled_kernel(
    vocab: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = 6
    generator = torch.Generator().manual_seed(vocab)
    logits = (torch.randn(rows, vocab + 64, generator=generator) * 5).to(torch.bfloat16)
    logits[2, :vocab] = logits[2, 0]  # one value everywhere: ties at every rank
    logits[3, 5] = -math.inf
    counts = torch.tensor([0, 3, 0, 0, 128, 0], dtype=torch.int32)
    token_ids = torch.randint(-2, vocab + 3, (rows, MAX_SELECTED_IDS), generator=generator)

    def reduce() -> torch.Tensor:
        out = torch.full((rows, 2, 2 + 2 * MAX_SELECTED_IDS), 7, dtype=torch.int32)
        inputs = ReductionInputs(
            logits,
            torch.arange(rows),
            torch.tensor([0, 1, 0, 1, 0, 1]),
            torch.randint(vocab, (rows,), generator=torch.Generator().manual_seed(1)),
            torch.tensor([1, 1, 0, 1, 1, 1], dtype=torch.int32),
            counts,
            token_ids.to(torch.int32),
            out,
        )
        ReferenceLogprobReducer(vocab, NATURAL_TOP_K).reduce(inputs)
        return out

    fast = reduce()
    without_native(monkeypatch)
    assert torch.equal(fast, reduce())


def test_the_prompt_scorer_writes_the_same_rows_without_the_compiled_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    vocab, hidden_size, count = 5000, 16, 70  # two projection blocks
    generator = torch.Generator().manual_seed(3)
    head = torch.randn(vocab, hidden_size, generator=generator)
    hidden = torch.randn(count, hidden_size, generator=generator) * 3
    targets = torch.randint(-1, vocab, (count,), generator=generator, dtype=torch.int32)

    def score() -> torch.Tensor:
        out = torch.zeros(count, PROMPT_ROW_WORDS, dtype=torch.int32)
        PromptScorer(vocab).score(hidden, targets, lambda rows: rows @ head.T, out)
        return out

    fast = score()
    without_native(monkeypatch)
    assert torch.equal(fast, score())
