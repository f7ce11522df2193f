"""Vocabulary-parallel prompt scoring on 2 and 3 gloo ranks equals the single-rank scorer."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch
import torch.distributed as dist

from adapters.gpu.distributed.shards import shard_range
from adapters.gpu.logprobs.normalizer import (
    LSE_TILE,
    combine_tiles,
    group_tiles,
    tile_statistics,
)
from adapters.gpu.scoring.prompt_scorer import PROJECTION_ROWS, PromptScorer
from adapters.gpu.scoring.prompt_scorer_vp import (
    EXCHANGE_WORDS,
    EXCHANGED_PAIRS,
    VocabParallelPromptScorer,
    run_tiles,
)
from domain.logprobs.prompt_scores import INVALID_BITS, PROMPT_ROW_WORDS
from domain.logprobs.values import NATURAL_TOP_K, NO_TOKEN
from tests.support.gloo import gloo_rank, record_each, refusal, spawn_worlds

SENTINEL = 0x5A5A5A5A
SPARE_ROWS = 2  # rows of `out` past the scored ones, which must keep the sentinel
WORLD_SIZES = (2, 3)
# Five tiles, the last of 904 lanes: 2 ranks hold [0, 3072) and [3072, 5000), 3 ranks hold
# [0, 2048), [2048, 4096) and [4096, 5000).
VOCAB = 5000
EDGES = [0, 1023, 1024, 2047, 2048, 3071, 3072, 4095, 4096, VOCAB - 1]
# Lanes a projection returns past its shard; any of them entering a reduction would show.
PADDING = (1e30, math.inf, math.nan)
NEGATIVE_ZERO_BITS = -(2**31)


@dataclass(frozen=True)
class Scenario:
    """Logit rows (which are also the hidden rows: projection slices them) and their targets.

    `ranks` and `leaders` give, per row index, the expected rank and first alternative IDs.
    """

    vocab: int
    logits: torch.Tensor
    targets: list[int]
    ranks: dict[int, int] = field(default_factory=dict)
    leaders: dict[int, list[int]] = field(default_factory=dict)

    def target_tensor(self) -> torch.Tensor:
        return torch.tensor(self.targets, dtype=torch.int32)

    def frame(self) -> torch.Tensor:
        rows = len(self.targets) + SPARE_ROWS
        return torch.full((rows, PROMPT_ROW_WORDS), SENTINEL, dtype=torch.int32)


def _random_rows() -> Scenario:
    # Three row blocks (64 + 64 + 22); targets on both sides of every shard and tile boundary,
    # and invalid ones (-1 at the prompt end, past the vocabulary, negative).
    generator = torch.Generator().manual_seed(7)
    logits = torch.randn(150, VOCAB, generator=generator) * 4.0
    targets = torch.randint(0, VOCAB, (150,), generator=generator).tolist()
    targets[: len(EDGES)] = EDGES
    targets[10], targets[70], targets[100], targets[149] = NO_TOKEN, VOCAB, -3, NO_TOKEN
    return Scenario(VOCAB, logits, targets)


def _wide_rows() -> Scenario:
    # Wide logits spread the mass over every tile, where the order of the tile sums shows.
    generator = torch.Generator().manual_seed(11)
    logits = torch.randn(6, VOCAB, generator=generator) * 9.0
    return Scenario(VOCAB, logits, [37 * row for row in range(6)])


TOP = [100, 2500, 4500]  # equal best values, on different ranks of 2 and of 3
TIED = [4999, 4096, 4095, 3072, 3071, 2048, 2047, 1024, 1023, 7, 2600, 1100, 33, 31, 2100]
TIED += [0, 1200, 36, 2200, 5, 17, 1300, 29, 2300, 44, 4200, 1400, 2400, 4800, 61]


def _ties_across_shards() -> Scenario:
    logits = torch.full((3, VOCAB), -2.0)
    logits[:, TOP] = 3.0
    logits[:, TIED] = 1.0  # more equal values at the cutoff than any one shard offers
    leaders = TOP + sorted(TIED)[: NATURAL_TOP_K - len(TOP)]
    return Scenario(
        VOCAB,
        logits,
        [2500, 4999, 3000],
        ranks={0: 1, 1: 1 + len(TOP), 2: 1 + len(TOP) + len(TIED)},
        leaders={0: leaders, 1: leaders, 2: leaders},
    )


def _subtraction_ties() -> Scenario:
    # 4000 is greater as a logit than 10, but the two are equal once lse (about 8.5) is
    # subtracted; they sit on different ranks in both worlds.
    logits = torch.zeros(2, VOCAB)
    logits[:, 10] = 1e-6
    logits[:, 4000] = 1.1e-6
    return Scenario(
        VOCAB, logits, [10, 4000], ranks={0: 1, 1: 1}, leaders={0: [10, 4000], 1: [10, 4000]}
    )


def _small_vocabulary() -> Scenario:
    # Seven lanes: every rank past the first holds an empty shard.
    logits = torch.tensor(
        [
            [0.5, 2.0, -1.0, 2.0, 0.0, -math.inf, 1.0],
            [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
            [-3.0, 0.0, 4.0, 0.0, 0.0, 0.0, 0.0],
            [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        ]
    )
    return Scenario(
        7,
        logits,
        [3, 5, 2, 7],
        ranks={0: 1, 1: 1, 2: 1},
        leaders={0: [1, 3, 6, 0, 4, 2, 5], 1: list(range(7)), 2: [2, 1, 3, 4, 5, 6, 0]},
    )


def _empty_last_shard() -> Scenario:
    # Two tiles: 3 ranks hold [0, 1024), [1024, 1500) and an empty shard.
    generator = torch.Generator().manual_seed(13)
    logits = torch.randn(4, 1500, generator=generator) * 3.0
    return Scenario(1500, logits, [1499, 1023, 1024, 1500])


def _negative_zero() -> Scenario:
    logits = torch.full((3, 3000), -math.inf)
    # Row 0: a single finite lane of -0.0, so lse is +0.0 and the reported value is -0.0.
    logits[0, 2100] = -0.0
    # Row 1: -0.0 and +0.0 logits report the same value, whatever their sign.
    generator = torch.Generator().manual_seed(17)
    choices = torch.tensor([-0.0, 0.0, 1.5, -1.0])
    logits[1] = choices[torch.randint(0, 4, (3000,), generator=generator)]
    logits[1, [5, 2500]] = torch.tensor([-0.0, 0.0])
    # Row 2: every lane -0.0.
    logits[2] = -0.0
    return Scenario(3000, logits, [2100, 5, 2999], ranks={0: 1, 2: 1}, leaders={0: [2100]})


def _one_token() -> Scenario:
    return Scenario(1, torch.tensor([[-0.0], [3.0], [1.0]]), [0, 0, NO_TOKEN], ranks={0: 1, 1: 1})


def _invalid_only() -> Scenario:
    generator = torch.Generator().manual_seed(19)
    return Scenario(VOCAB, torch.randn(3, VOCAB, generator=generator), [NO_TOKEN, VOCAB, -7])


SCENARIOS: dict[str, Callable[[], Scenario]] = {
    "random_rows": _random_rows,
    "wide_rows": _wide_rows,
    "ties_across_shards": _ties_across_shards,
    "subtraction_ties": _subtraction_ties,
    "small_vocabulary": _small_vocabulary,
    "empty_last_shard": _empty_last_shard,
    "negative_zero": _negative_zero,
    "one_token": _one_token,
    "invalid_only": _invalid_only,
}


# Llama 3's 128,256 and Qwen2.5's 151,936 IDs put 63 to 75 tiles on a shard of 2 or 3 ranks,
# more pairs than exchange 1 carries: runs of tiles travel as one pair each.
WIDE_VOCAB = 151_936
# Grouped tiles round the normalizer differently from one tile at a time: a few FP32 ulps of
# lse (about 12 here), never more.
GROUPED_ROUNDING = 1e-5


def _wide_vocabulary() -> Scenario:
    generator = torch.Generator().manual_seed(23)
    logits = torch.randn(5, WIDE_VOCAB, generator=generator) * 4.0
    # Targets on both sides of the 2- and 3-rank shard boundaries and at the vocabulary's end.
    targets = [76_799, 76_800, 51_200, 102_399, WIDE_VOCAB - 1]
    return Scenario(WIDE_VOCAB, logits, targets)


WIDE_SCENARIOS: dict[str, Callable[[], Scenario]] = {"wide_vocabulary": _wide_vocabulary}


def _shard_projection(vocab: int, world: int, rank: int, seen: list[int]):
    """A `project` returning this rank's lanes, as wide as rank 0's shard, padding past it."""
    start, stop = shard_range(vocab, world, rank)
    width = shard_range(vocab, world, 0)[1]
    padding = torch.tensor(PADDING * width)[: width - (stop - start)]

    def project(rows: torch.Tensor) -> torch.Tensor:
        seen.append(rows.shape[0])
        shard = torch.empty(rows.shape[0], width)
        shard[:, stop - start :] = padding
        shard[:, : stop - start] = rows[:, start:stop]
        return shard

    return project


def _run(scenario: Scenario, world: int, rank: int) -> dict:
    """This rank's packed rows, the rows each projection saw and each all-gather's shapes."""
    calls: list[list] = []
    original = dist.all_gather_single

    def recording(output_tensor, input_tensor, group=None, async_op=False):
        calls.append([list(input_tensor.shape), str(input_tensor.dtype), list(output_tensor.shape)])
        return original(output_tensor, input_tensor, group=group, async_op=async_op)

    seen: list[int] = []
    project = _shard_projection(scenario.vocab, world, rank, seen)
    out = scenario.frame()
    scorer = VocabParallelPromptScorer(scenario.vocab, rank, world)
    dist.all_gather_single = recording
    try:
        scorer.score(scenario.logits, scenario.target_tensor(), project, out)
    finally:
        dist.all_gather_single = original
    return {"out": out.flatten().tolist(), "calls": calls, "projected": seen}


def _refusal(world: int, rank: int, told_rank: int, narrow: bool) -> str | None:
    """The error text of a scorer told `told_rank` or given too narrow a projection, if any."""
    scenario = _wide_rows()
    scorer = VocabParallelPromptScorer(VOCAB, told_rank, world)
    width = shard_range(VOCAB, world, told_rank)[1] - shard_range(VOCAB, world, told_rank)[0]
    columns = width - 1 if narrow else width
    return refusal(
        lambda: scorer.score(
            scenario.logits,
            scenario.target_tensor(),
            lambda rows: torch.zeros(rows.shape[0], columns),
            scenario.frame(),
        )
    )


def _worker(rank: int, world: int, directory: str) -> None:
    with gloo_rank(rank, world, directory, timeout_s=30) as results:
        record_each(results, SCENARIOS, lambda name: _run(SCENARIOS[name](), world, rank))
        record_each(results, WIDE_SCENARIOS, lambda name: _run(WIDE_SCENARIOS[name](), world, rank))
        results["misplaced_rank"] = _refusal(world, rank, (rank + 1) % world, narrow=False)
        results["narrow_projection"] = _refusal(world, rank, rank, narrow=True)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[tuple[int, int], dict]:
    """(world, rank) -> scenario name -> what that rank produced, from one spawn per world."""
    return spawn_worlds(_worker, WORLD_SIZES, tmp_path_factory)


def _produced(outcomes, name: str) -> list[tuple[int, int, torch.Tensor]]:
    """(world, rank, packed rows) of every rank, after checking that none of them failed."""
    produced = []
    for (world, rank), results in outcomes.items():
        result = results[name]
        assert "error" not in result, f"world {world} rank {rank}:\n{result['error']}"
        rows = torch.tensor(result["out"], dtype=torch.int32).view(-1, PROMPT_ROW_WORDS)
        produced.append((world, rank, rows))
    return produced


def _single_rank(scenario: Scenario) -> torch.Tensor:
    out = scenario.frame()
    PromptScorer(scenario.vocab).score(scenario.logits, scenario.target_tensor(), torch.clone, out)
    return out


def _reported(logits: torch.Tensor) -> torch.Tensor:
    return logits - combine_tiles(*tile_statistics(logits))[:, None]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_rank_writes_the_single_rank_scorers_rows_word_for_word(outcomes, name) -> None:
    scenario = SCENARIOS[name]()
    expected = _single_rank(scenario)
    for world, rank, got in _produced(outcomes, name):
        differing = (got != expected).nonzero().tolist()
        assert not differing, (name, world, rank, differing[:4])
        for row, leaders in scenario.leaders.items():
            assert got[row, 3 : 3 + 2 * len(leaders) : 2].tolist() == leaders, (name, row)
        for row, rank_expected in scenario.ranks.items():
            assert got[row, 2].item() == rank_expected, (name, row)


@pytest.mark.slow
def test_equal_values_on_different_ranks_order_by_id_and_never_count_as_greater(
    outcomes,
) -> None:
    # The word-for-word test checks the leaders and ranks; here the scenario itself is checked,
    # so that the ties it relies on really span the shards of both worlds.
    for world in WORLD_SIZES:
        owners = {
            rank
            for rank in range(world)
            for token_id in TOP
            if shard_range(VOCAB, world, rank)[0] <= token_id < shard_range(VOCAB, world, rank)[1]
        }
        assert owners == set(range(world)), world
    for _, _, got in _produced(outcomes, "ties_across_shards"):
        assert got[1, 2].item() == 1 + len(TOP)
        bits = got[0, 4 : 4 + 2 * len(TOP) : 2].tolist()
        assert len(set(bits)) == 1


@pytest.mark.slow
def test_ties_made_by_subtracting_the_normalizer_rank_both_tokens_first(outcomes) -> None:
    values = _reported(_subtraction_ties().logits)
    assert values[0, 10] == values[0, 4000], "the tie this test needs did not form"
    for _, _, got in _produced(outcomes, "subtraction_ties"):
        assert got[:2, 2].tolist() == [1, 1]
        assert got[0, 1].item() == got[1, 1].item()


@pytest.mark.slow
def test_a_vocabulary_smaller_than_twenty_pads_alternatives_with_minus_one(outcomes) -> None:
    for name, vocab in (("small_vocabulary", 7), ("one_token", 1)):
        for _, _, got in _produced(outcomes, name):
            for row in range(2):
                tail = got[row, 3 + 2 * vocab :].tolist()
                assert tail == [NO_TOKEN, 0] * (NATURAL_TOP_K - vocab), (name, row)


@pytest.mark.slow
def test_a_reported_negative_zero_keeps_its_sign_bit(outcomes) -> None:
    for name in ("negative_zero", "one_token"):
        for _, _, got in _produced(outcomes, name):
            assert got[0, 1].item() == NEGATIVE_ZERO_BITS, name
            assert got[0, 4].item() == NEGATIVE_ZERO_BITS, name


@pytest.mark.slow
def test_invalid_targets_write_invalid_rows_and_rows_past_the_chunk_stay_unwritten(
    outcomes,
) -> None:
    invalid = [NO_TOKEN, INVALID_BITS, 0] + [NO_TOKEN, 0] * NATURAL_TOP_K
    for name in SCENARIOS:
        scenario = SCENARIOS[name]()
        for _, _, got in _produced(outcomes, name):
            for row, target in enumerate(scenario.targets):
                if not 0 <= target < scenario.vocab:
                    assert got[row].tolist() == invalid, (name, row)
            assert got[len(scenario.targets) :].eq(SENTINEL).all(), name


@pytest.mark.slow
def test_each_exchange_carries_64_int32_words_per_row_per_rank(outcomes) -> None:
    assert EXCHANGE_WORDS == 64
    for name, build in SCENARIOS.items():
        rows = len(build().targets)
        blocks = [min(PROJECTION_ROWS, rows - first) for first in range(0, rows, PROJECTION_ROWS)]
        for (world, rank), results in outcomes.items():
            expected = []
            for block in blocks:
                call = [[block, EXCHANGE_WORDS], "torch.int32", [world * block, EXCHANGE_WORDS]]
                expected += [call, call]
            assert results[name]["calls"] == expected, (name, world, rank)


@pytest.mark.slow
def test_project_never_sees_more_than_64_rows(outcomes) -> None:
    for (world, rank), results in outcomes.items():
        assert results["random_rows"]["projected"] == [64, 64, 22], (world, rank)
        for name in SCENARIOS:
            assert max(results[name]["projected"]) <= PROJECTION_ROWS, (name, world, rank)


@pytest.mark.slow
def test_a_scorer_told_the_wrong_rank_or_given_a_narrow_projection_refuses(outcomes) -> None:
    for (world, rank), results in outcomes.items():
        assert "the group has rank" in (results["misplaced_rank"] or ""), (world, rank)
        assert "project returned" in (results["narrow_projection"] or ""), (world, rank)


@pytest.mark.slow
def test_a_vocabulary_of_151936_ids_is_scored_on_2_and_3_ranks_like_one_rank(outcomes) -> None:
    # Before runs of tiles were grouped, every rank refused this vocabulary at construction.
    scenario = _wide_vocabulary()
    expected = _single_rank(scenario)
    produced = _produced(outcomes, "wide_vocabulary")
    for world in WORLD_SIZES:
        assert run_tiles(-(-shard_range(WIDE_VOCAB, world, 0)[1] // LSE_TILE)) > 1, world
    for world, rank, got in produced:
        rows = len(scenario.targets)
        assert got[:rows, 0].tolist() == scenario.targets
        assert got[:rows, 2].tolist() == expected[:rows, 2].tolist(), (world, rank)
        assert got[:rows, 3::2].tolist() == expected[:rows, 3::2].tolist(), (world, rank)
        values = got[:rows, 1::2].contiguous().view(torch.float32)
        reference = expected[:rows, 1::2].contiguous().view(torch.float32)
        assert torch.allclose(values, reference, rtol=0.0, atol=GROUPED_ROUNDING), (world, rank)
        assert got[rows:].eq(SENTINEL).all()
    # Every rank of a world writes the same words: the grouped normalizer is everyone's.
    for world in WORLD_SIZES:
        words = [got for w, _, got in produced if w == world]
        assert all(torch.equal(words[0], other) for other in words[1:]), world


@pytest.mark.slow
def test_a_wide_vocabulary_still_exchanges_64_words_per_row_per_rank(outcomes) -> None:
    rows = len(_wide_vocabulary().targets)
    for (world, rank), results in outcomes.items():
        call = [[rows, EXCHANGE_WORDS], "torch.int32", [world * rows, EXCHANGE_WORDS]]
        assert results["wide_vocabulary"]["calls"] == [call, call], (world, rank)


@pytest.mark.parametrize(
    ("vocab", "world"),
    [
        (EXCHANGED_PAIRS * LSE_TILE, 1),
        (2 * EXCHANGED_PAIRS * LSE_TILE + 1, 2),
        (128_256, 2),
        (151_936, 1),
        (151_936, 2),
        (262_144, 2),
    ],
)
def test_a_scorer_accepts_shards_of_any_number_of_tiles(vocab, world) -> None:
    for rank in range(world):
        VocabParallelPromptScorer(vocab, rank, world)


@pytest.mark.parametrize("tiles", [1, 30, 31, 32, 62, 63, 75, 149, 1000])
def test_a_shard_sends_at_most_31_pairs_and_one_per_tile_while_they_fit(tiles) -> None:
    run = run_tiles(tiles)
    assert -(-tiles // run) <= EXCHANGED_PAIRS == 31
    assert (run == 1) == (tiles <= EXCHANGED_PAIRS)


def test_runs_of_tiles_normalize_like_their_tiles_within_fp32_rounding() -> None:
    generator = torch.Generator().manual_seed(29)
    logits = torch.randn(4, 75 * LSE_TILE - 300, generator=generator) * 6.0
    logits[1] = -math.inf
    logits[2, : 10 * LSE_TILE] = -math.inf  # runs with no mass at all
    peaks, masses = tile_statistics(logits)
    plain = combine_tiles(peaks, masses)
    for size in (1, 2, 3, 7, 75):
        grouped = combine_tiles(*group_tiles(peaks, masses, size))
        if size == 1:
            assert torch.equal(grouped, plain)
        assert grouped[1].item() == -math.inf
        finite = torch.isfinite(plain)
        assert torch.allclose(grouped[finite], plain[finite], rtol=0.0, atol=4e-6), size


@pytest.mark.parametrize(("vocab", "world", "rank"), [(0, 2, 0), (10, 0, 0), (10, 2, 2)])
def test_a_scorer_rejects_empty_vocabularies_worlds_and_foreign_ranks(vocab, world, rank) -> None:
    with pytest.raises(ValueError):
        VocabParallelPromptScorer(vocab, rank, world)
