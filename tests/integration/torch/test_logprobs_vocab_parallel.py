"""Vocabulary-parallel logprobs on 2 and 3 gloo ranks equal the single-rank reference exactly."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
import torch
import torch.distributed as dist

from adapters.gpu.distributed.shards import shard_range
from adapters.gpu.logprobs.normalizer import LSE_TILE
from adapters.gpu.logprobs.reducer import ReductionInputs
from adapters.gpu.logprobs.reference_reducer import ReferenceLogprobReducer
from adapters.gpu.logprobs.reference_reducer_vp import (
    EXCHANGE_WORDS,
    MAX_SHARD_TILES,
    VocabParallelLogprobReducer,
)
from domain.logprobs.values import (
    FULL_POSITION_WORDS,
    MAX_SELECTED_IDS,
    NATURAL_TOP_K,
    bits_to_float,
)
from tests.support.gloo import gloo_rank, record_each, refusal, spawn_worlds

SENTINEL = 0x5A5A5A5A
WORLD_SIZES = (2, 3)
# Five tiles, the last of 4 lanes: 2 ranks hold 3 + 2 tiles ([0, 3072), [3072, 4100)) and
# 3 ranks hold 2 + 2 + 1 ([0, 2048), [2048, 4096), [4096, 4100)).
UNEVEN = 4 * LSE_TILE + 4
# Three tiles: 2 + 1 over 2 ranks, 1 + 1 + 1 over 3.
THREE_TILES = 3 * LSE_TILE - 72
# Padded lanes of the last shard hold values that would dominate any reduction they entered.
PADDING = (1e30, math.inf, math.nan)


@dataclass(frozen=True)
class Scenario:
    """Full logits, the rows' (slot, position, chosen) and each requesting slot's selection."""

    vocab: int
    logits: torch.Tensor
    rows: list[tuple[int, int, int]]
    requests: dict[int, list[int] | None]
    capacity: int
    tokens: int = 1
    full: bool = True
    top_k: int = NATURAL_TOP_K
    expected_ids: dict[int, list[int]] = field(default_factory=dict)

    def frame(self) -> tuple[torch.Tensor, ...]:
        """A sentinel-filled output with flags, counts and stale-filled IDs (or None, None)."""
        words = FULL_POSITION_WORDS if self.full else 2 + 2 * self.top_k
        out = torch.full((self.capacity, self.tokens, words), SENTINEL, dtype=torch.int32)
        requested = torch.zeros(self.capacity, dtype=torch.int32)
        counts = token_ids = None
        if self.full:
            counts = torch.zeros(self.capacity, dtype=torch.int32)
            stale = torch.tensor([10**6, -5], dtype=torch.int32)
            token_ids = stale.repeat(self.capacity, MAX_SELECTED_IDS // 2)
        for slot, ids in self.requests.items():
            requested[slot] = 1
            if ids:
                counts[slot] = len(ids)
                token_ids[slot, : len(ids)] = torch.tensor(ids, dtype=torch.int32)
        return out, requested, counts, token_ids

    def columns(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return tuple(torch.tensor([row[i] for row in self.rows]) for i in range(3))

    def requesting_rows(self) -> int:
        return sum(slot in self.requests for slot, _, _ in self.rows)


def _random(rows: int, vocab: int, seed: int, dtype: torch.dtype, scale: float = 4.0):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, vocab, generator=generator) * scale).to(dtype)


def _natural_mixed(dtype: torch.dtype) -> Scenario:
    # Chosen IDs sit on both sides of every 2-rank and 3-rank boundary and of the inner tile
    # boundaries; slot 1 does not request, and its rows carry a position no write could survive.
    rows = [(0, 0, 0), (1, 9, 10**9), (0, 2, 1023), (2, 0, 1024), (3, 1, 4099), (1, 9, 5)]
    rows += [(2, 1, 2047), (3, 0, 2048), (0, 1, 3071), (2, 2, 3072), (3, 2, 4095), (1, 0, 4096)]
    return Scenario(
        vocab=UNEVEN,
        logits=_random(len(rows), UNEVEN, 7, dtype),
        rows=rows,
        requests={0: None, 2: None, 3: None},
        capacity=4,
        tokens=3,
    )


def _selected(dtype: torch.dtype) -> Scenario:
    generator = torch.Generator().manual_seed(5)
    edges = [1023, 1024, 2047, 2048, 3071, 3072, 4095, 4096]
    many = torch.randperm(UNEVEN, generator=generator)[:MAX_SELECTED_IDS].tolist()
    many = [i for i in many if i not in edges + [4099]]
    # 4101 names a padded lane and -3 nothing: both report NaN without a read.
    many = ([4099, 4101] + edges[:4] + [-3] + edges[4:] + many)[:MAX_SELECTED_IDS]
    rows = [(0, 0, 12), (1, 0, 700), (2, 0, 3072), (3, 0, 1), (1, 1, 4096)]
    return Scenario(
        vocab=UNEVEN,
        logits=_random(len(rows), UNEVEN, 9, dtype),
        rows=rows,
        requests={0: [11], 1: many, 2: None},
        capacity=4,
        tokens=2,
    )


def _ties_across_shards(dtype: torch.dtype) -> Scenario:
    vocab = THREE_TILES
    logits = torch.full((2, vocab), -2.0)
    logits[:, [2500, 1500, 10]] = torch.tensor([3.0, 2.5, 2.0])
    # Equal values in every tile, so every rank of 2 and 3 offers some of the cutoff's ties.
    tied = [vocab - 1, 2048, 2047, 1024, 1023, 7, 2600, 1100, 33, 31, 2100, 0, 1200, 36, 2200]
    tied += [5, 17, 1300, 29, 2300, 44, 13, 1400, 2400, 26, 38, 9, 61, 2049, 1025]
    logits[:, tied] = 1.0
    winners = [2500, 1500, 10] + sorted(set(tied))[: NATURAL_TOP_K - 3]
    return Scenario(
        vocab=vocab,
        logits=logits.to(dtype),
        rows=[(0, 0, 2500), (1, 0, vocab - 1)],
        requests={0: None, 1: None},
        capacity=2,
        full=False,
        expected_ids={0: winners, 1: winners},
    )


def _ties_everywhere() -> Scenario:
    # Every shard holds more equal values than the 32 candidates it may offer.
    return Scenario(
        vocab=THREE_TILES,
        logits=torch.full((1, THREE_TILES), 0.25),
        rows=[(0, 0, 2100)],
        requests={0: None},
        capacity=1,
        expected_ids={0: list(range(NATURAL_TOP_K))},
    )


def _wide_fp32() -> Scenario:
    # Wide logits spread the mass over every tile, where the order of the tile sums shows.
    rows = [(slot, 0, 37 * slot) for slot in range(6)]
    return Scenario(
        vocab=THREE_TILES,
        logits=_random(len(rows), THREE_TILES, 11, torch.float32, scale=9.0),
        rows=rows,
        requests={slot: None for slot in range(6)},
        capacity=6,
    )


def _small_vocabulary(vocab: int, full: bool) -> Scenario:
    logits = torch.tensor(
        [[0.5, 2.0, -1.0, 2.0, 0.0][:vocab], [1.0, -math.inf, 3.0, 0.5, 1.0][:vocab]]
    )
    ranked = sorted(range(vocab), key=lambda i: (-logits[0, i].item(), i))
    return Scenario(
        vocab=vocab,
        logits=logits,
        rows=[(0, 1, vocab - 1), (1, 0, 0)],
        requests={0: None, 1: [vocab - 1, 0] if full else None},
        capacity=2,
        tokens=2,
        full=full,
        expected_ids={0: ranked + [-1] * (NATURAL_TOP_K - vocab)},
    )


def _two_tiles() -> Scenario:
    # Two tiles over 3 ranks leave the third shard empty; 1500 is past the vocabulary.
    rows = [(0, 0, 1499), (1, 0, 1023), (2, 1, 1024)]
    return Scenario(
        vocab=1500,
        logits=_random(len(rows), 1500, 13, torch.bfloat16),
        rows=rows,
        requests={0: [1024, 1500, 1023, 0, 1499], 1: None, 2: None},
        capacity=3,
        tokens=2,
    )


def _one_finite_shard() -> Scenario:
    # Only the first tile (row 0) or the last lane (row 1) is finite: the -inf tiles hold zero
    # mass, and their factors overflow (row 0) without poisoning the normalizer.
    vocab = THREE_TILES
    logits = torch.full((2, vocab), -math.inf)
    logits[0, [3, 1, 7]] = torch.tensor([-200.0, -201.0, -199.5])
    logits[1, vocab - 1] = 50.0
    return Scenario(
        vocab=vocab,
        logits=logits,
        rows=[(0, 0, vocab - 1), (1, 0, 0)],
        requests={0: None, 1: [vocab - 1, 0, 1500]},
        capacity=2,
    )


def _narrow_frame() -> Scenario:
    rows = [(0, 0, 3), (1, 0, 400), (2, 0, 4097)]
    return Scenario(
        vocab=UNEVEN,
        logits=_random(len(rows), UNEVEN, 3, torch.float32, scale=2.0),
        rows=rows,
        requests={0: None, 2: None},
        capacity=3,
        full=False,
        top_k=2,
    )


def _nobody_requests() -> Scenario:
    return Scenario(
        vocab=UNEVEN,
        logits=_random(2, UNEVEN, 1, torch.float32),
        rows=[(0, 0, 1), (1, 0, 2)],
        requests={},
        capacity=2,
    )


SCENARIOS = {
    "natural_fp32": lambda: _natural_mixed(torch.float32),
    "natural_bf16": lambda: _natural_mixed(torch.bfloat16),
    "selected_fp32": lambda: _selected(torch.float32),
    "selected_bf16": lambda: _selected(torch.bfloat16),
    "ties_fp32": lambda: _ties_across_shards(torch.float32),
    "ties_bf16": lambda: _ties_across_shards(torch.bfloat16),
    "ties_everywhere": _ties_everywhere,
    "wide_fp32": _wide_fp32,
    "two_tiles_bf16": _two_tiles,
    "vocab_5_natural": lambda: _small_vocabulary(5, full=False),
    "vocab_5_full": lambda: _small_vocabulary(5, full=True),
    "vocab_2_full": lambda: _small_vocabulary(2, full=True),
    "one_finite_shard": _one_finite_shard,
    "narrow_frame": _narrow_frame,
    "nobody_requests": _nobody_requests,
}


def _shard(logits: torch.Tensor, vocab: int, world: int, rank: int) -> torch.Tensor:
    """This rank's columns, every shard as wide as the first, the missing lanes padded."""
    start, stop = shard_range(vocab, world, rank)
    width = shard_range(vocab, world, 0)[1]
    shard = torch.empty(logits.shape[0], width, dtype=logits.dtype)
    shard[:, stop - start :] = torch.tensor(PADDING * width)[: width - (stop - start)].to(
        logits.dtype
    )
    shard[:, : stop - start] = logits[:, start:stop]
    return shard


def _run(scenario: Scenario, world: int, rank: int) -> dict:
    """This rank's packed output and the (shape, dtype, ranks) of each all-gather it made."""
    calls: list[list] = []
    original = dist.all_gather

    def counting(tensor_list, tensor, group=None, async_op=False):
        calls.append([list(tensor.shape), str(tensor.dtype), len(tensor_list)])
        return original(tensor_list, tensor, group=group, async_op=async_op)

    out, requested, counts, token_ids = scenario.frame()
    slots, positions, chosen = scenario.columns()
    shard = _shard(scenario.logits, scenario.vocab, world, rank)
    before = shard.clone()
    reducer = VocabParallelLogprobReducer(scenario.vocab, scenario.top_k, rank, world)
    dist.all_gather = counting
    try:
        reducer.reduce(
            ReductionInputs(shard, slots, positions, chosen, requested, counts, token_ids, out)
        )
    finally:
        dist.all_gather = original
    # Bytes, not values: NaN padding never equals itself.
    untouched = torch.equal(shard.view(torch.uint8), before.view(torch.uint8))
    return {"out": out.flatten().tolist(), "calls": calls, "shard_untouched": untouched}


def _misplaced_rank(world: int, rank: int) -> str | None:
    """The error text of a reducer told the wrong rank: every rank refuses before any exchange."""
    scenario = _natural_mixed(torch.float32)
    out, requested, counts, token_ids = scenario.frame()
    reducer = VocabParallelLogprobReducer(scenario.vocab, NATURAL_TOP_K, (rank + 1) % world, world)
    width = shard_range(scenario.vocab, world, 0)[1]
    shard = torch.zeros(len(scenario.rows), width)
    return refusal(
        lambda: reducer.reduce(
            ReductionInputs(shard, *scenario.columns(), requested, counts, token_ids, out)
        )
    )


def _worker(rank: int, world: int, directory: str) -> None:
    with gloo_rank(rank, world, directory, timeout_s=30) as results:
        record_each(results, SCENARIOS, lambda name: _run(SCENARIOS[name](), world, rank))
        results["misplaced_rank"] = _misplaced_rank(world, rank)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[tuple[int, int], dict]:
    """(world, rank) -> scenario name -> what that rank produced, from one spawn per world."""
    return spawn_worlds(_worker, WORLD_SIZES, tmp_path_factory)


def _produced(outcomes, name: str) -> list[tuple[int, int, torch.Tensor]]:
    """(world, rank, packed output) of every rank, after checking that none of them failed."""
    scenario = SCENARIOS[name]()
    shape = scenario.frame()[0].shape
    produced = []
    for (world, rank), results in outcomes.items():
        result = results[name]
        assert "error" not in result, f"world {world} rank {rank}:\n{result['error']}"
        assert result["shard_untouched"]
        out = torch.tensor(result["out"], dtype=torch.int32).view(shape)
        produced.append((world, rank, out))
    return produced


def _reference(scenario: Scenario) -> torch.Tensor:
    out, requested, counts, token_ids = scenario.frame()
    ReferenceLogprobReducer(scenario.vocab, scenario.top_k).reduce(
        ReductionInputs(scenario.logits, *scenario.columns(), requested, counts, token_ids, out)
    )
    return out


def _assert_matches_reference(outcomes, name: str) -> None:
    """Every rank's packed output equals the reference's word for word.

    IDs, FP32 bits, -1 padding and untouched sentinels alike: the normalizer is rebuilt from the
    same tiles in the same order, so no rounding difference is allowed.
    """
    scenario = SCENARIOS[name]()
    expected = _reference(scenario)
    for world, rank, got in _produced(outcomes, name):
        where = f"{name}, world {world} rank {rank}"
        differing = (got != expected).nonzero().tolist()
        assert not differing, (where, differing[:4])
        for slot, ids in scenario.expected_ids.items():
            position = next(p for s, p, _ in scenario.rows if s == slot)
            assert got[slot, position, 2 : 2 + 2 * len(ids) : 2].tolist() == ids, where


@pytest.mark.slow
@pytest.mark.parametrize("name", ["natural_fp32", "natural_bf16", "narrow_frame", "wide_fp32"])
def test_natural_alternatives_of_mixed_lanes_match_the_single_rank_reference(
    outcomes, name
) -> None:
    _assert_matches_reference(outcomes, name)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["selected_fp32", "selected_bf16", "two_tiles_bf16"])
def test_selected_ids_report_in_caller_order_as_the_reference_does(outcomes, name) -> None:
    _assert_matches_reference(outcomes, name)
    scenario = SCENARIOS[name]()
    for world, rank, got in _produced(outcomes, name):
        for slot, ids in scenario.requests.items():
            if ids:
                assert got[slot, 0, 2 : 2 + 2 * len(ids) : 2].tolist() == ids, (world, rank)
                # Past a selection the frame keeps its contents.
                assert set(got[slot, 0, 2 + 2 * len(ids) :].tolist()) <= {SENTINEL}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ties_fp32", "ties_bf16", "ties_everywhere"])
def test_equal_values_at_the_cutoff_on_different_ranks_select_the_smallest_ids(
    outcomes, name
) -> None:
    _assert_matches_reference(outcomes, name)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vocab_5_natural", "vocab_5_full", "vocab_2_full"])
def test_a_vocabulary_smaller_than_k_pads_with_minus_one_even_with_an_empty_shard(
    outcomes, name
) -> None:
    _assert_matches_reference(outcomes, name)
    vocab = SCENARIOS[name]().vocab
    for _, _, got in _produced(outcomes, name):
        tail = got[0, 1, 2 + 2 * vocab : 2 + 2 * NATURAL_TOP_K].tolist()
        assert tail == [-1, 0] * (NATURAL_TOP_K - vocab)


@pytest.mark.slow
def test_shards_holding_only_minus_infinity_leave_the_normalizer_finite(outcomes) -> None:
    _assert_matches_reference(outcomes, "one_finite_shard")
    for _, _, got in _produced(outcomes, "one_finite_shard"):
        assert math.isfinite(bits_to_float(int(got[0, 0, 3])))
        assert bits_to_float(int(got[0, 0, 1])) == -math.inf


@pytest.mark.slow
def test_every_exchange_carries_256_fp32_words_per_requesting_position_per_rank(
    outcomes,
) -> None:
    for name, build in SCENARIOS.items():
        rows = build().requesting_rows()
        if not rows:
            continue
        for (world, rank), results in outcomes.items():
            expected = [[rows, EXCHANGE_WORDS], "torch.float32", world]
            assert results[name]["calls"] == [expected, expected], (name, world, rank)


@pytest.mark.slow
def test_without_a_requesting_row_no_rank_exchanges_or_writes(outcomes) -> None:
    for (world, rank), results in outcomes.items():
        assert results["nobody_requests"]["calls"] == [], (world, rank)
    for _, _, got in _produced(outcomes, "nobody_requests"):
        assert set(got.flatten().tolist()) == {SENTINEL}


@pytest.mark.slow
def test_every_rank_writes_the_same_packed_output(outcomes) -> None:
    for name in SCENARIOS:
        by_world: dict[int, torch.Tensor] = {}
        for world, rank, got in _produced(outcomes, name):
            first = by_world.setdefault(world, got)
            assert torch.equal(got, first), (name, world, rank)


@pytest.mark.slow
def test_a_reducer_told_the_wrong_rank_refuses_before_any_exchange(outcomes) -> None:
    for results in outcomes.values():
        assert results["misplaced_rank"] is not None
        assert "rank" in results["misplaced_rank"]


@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("vocab", [1, 2, 5, 1000, 1024, 1025, 3000, 4100, 151_936])
def test_shard_ranges_are_whole_tiles_split_as_evenly_as_possible(vocab, world) -> None:
    ranges = [shard_range(vocab, world, rank) for rank in range(world)]
    assert ranges[0][0] == 0 and ranges[-1][1] == vocab
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    # Every boundary but the vocabulary's end starts a tile of the single-rank normalizer.
    assert all(stop % LSE_TILE == 0 for _, stop in ranges if stop != vocab)
    tiles = [-(-(stop - start) // LSE_TILE) for start, stop in ranges]
    assert sum(tiles) == -(-vocab // LSE_TILE)
    assert tiles == sorted(tiles, reverse=True) and tiles[0] - tiles[-1] <= 1
    # Rank 0's range is the widest, so every rank's tensor can share its width.
    widths = [stop - start for start, stop in ranges]
    assert max(widths) == widths[0]


@pytest.mark.parametrize(
    ("vocab", "world", "expected"),
    [
        (3 * LSE_TILE, 2, [(0, 2048), (2048, 3072)]),
        (UNEVEN, 3, [(0, 2048), (2048, 4096), (4096, 4100)]),
        (UNEVEN, 2, [(0, 3072), (3072, 4100)]),
        (1000, 3, [(0, 1000), (1000, 1000), (1000, 1000)]),
        (1500, 3, [(0, 1024), (1024, 1500), (1500, 1500)]),
    ],
)
def test_uneven_tile_counts_put_the_extra_tiles_on_the_first_ranks(vocab, world, expected) -> None:
    assert [shard_range(vocab, world, rank) for rank in range(world)] == expected


@pytest.mark.parametrize(
    ("vocab", "world"),
    [(MAX_SHARD_TILES * LSE_TILE, 1), (151_936, 2), (2 * MAX_SHARD_TILES * LSE_TILE, 2)],
)
def test_a_reducer_accepts_shards_of_up_to_127_tiles(vocab, world) -> None:
    for rank in range(world):
        VocabParallelLogprobReducer(vocab, NATURAL_TOP_K, rank, world)


@pytest.mark.parametrize(
    ("vocab", "world"),
    [(MAX_SHARD_TILES * LSE_TILE + 1, 1), (151_936, 1), (2 * MAX_SHARD_TILES * LSE_TILE + 1, 2)],
)
def test_every_rank_refuses_a_shard_of_more_tiles_than_exchange_1_carries(vocab, world) -> None:
    assert MAX_SHARD_TILES == 127
    for rank in range(world):
        with pytest.raises(ValueError, match="at most 127"):
            VocabParallelLogprobReducer(vocab, NATURAL_TOP_K, rank, world)


@pytest.mark.parametrize(
    ("vocab", "world", "rank"), [(0, 1, 0), (10, 0, 0), (10, 2, 2), (10, 2, -1)]
)
def test_shard_range_rejects_empty_vocabularies_worlds_and_foreign_ranks(
    vocab, world, rank
) -> None:
    with pytest.raises(ValueError):
        shard_range(vocab, world, rank)


@pytest.mark.parametrize("top_k", [0, NATURAL_TOP_K + 1])
def test_a_reducer_rejects_k_outside_one_to_twenty(top_k) -> None:
    with pytest.raises(ValueError):
        VocabParallelLogprobReducer(100, top_k, 0, 2)


def test_reduce_rejects_shards_narrower_than_their_range_before_any_exchange() -> None:
    scenario = _nobody_requests()
    out, requested, counts, token_ids = scenario.frame()
    reducer = VocabParallelLogprobReducer(UNEVEN, NATURAL_TOP_K, 2, 3)
    with pytest.raises(ValueError):
        reducer.reduce(
            ReductionInputs(
                torch.zeros(2, 3), *scenario.columns(), requested, counts, token_ids, out
            )
        )
    with pytest.raises(TypeError):
        reducer.reduce(
            ReductionInputs(
                torch.zeros(2, 4, dtype=torch.int32),
                *scenario.columns(),
                requested,
                counts,
                token_ids,
                out,
            )
        )
