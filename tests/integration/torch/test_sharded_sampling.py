"""Sampling and verification over vocabulary shards on 2 and 3 gloo ranks equal whole rows."""

from __future__ import annotations

import math

import pytest
import torch

from adapters.gpu.distributed.collectives import Collectives
from adapters.gpu.distributed.shards import VocabShard, shard_range
from adapters.gpu.sampling.sampler import Sampler
from adapters.gpu.sampling.sampler_vp import CUTOFF_CANDIDATES, ShardRows
from tests.integration.torch.test_sampler import build
from tests.support.gloo import gloo_rank, record_each, spawn_worlds

VOCAB = 2500  # three tiles: 2048 + 452 over 2 ranks, 1024 + 1024 + 452 over 3
ROWS = 12
SCENARIOS = ("ties", "filters", "flat_top_p", "wide_top_k", "verify_history", "verify_draft")


def _logits(seed: int, scale: float) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(ROWS, VOCAB, generator=generator) * scale


def _scenario(name: str, start: int = 0, stop: int = VOCAB) -> dict:
    """Logits and the settings of one scenario; bias and bans only on IDs in [start, stop)."""

    def local(pairs):
        return [(row, token - start, *rest) for row, token, *rest in pairs if start <= token < stop]

    seeds = list(range(100, 100 + ROWS))
    temperatures = [0.0, 0.7, 1.0, 1.3] * (ROWS // 4)
    if name == "ties":
        logits = _logits(1, 1.0)
        for row in range(ROWS):  # equal maxima in every shard: the lowest ID wins
            logits[row, [100 + row, 1500 + row, 2100 + row, 2400 + row]] = 9.0
        return {"logits": logits, "tensors": build(ROWS, VOCAB, temperature=0.0)}
    if name == "filters":
        bias = [(0, 5, 6.0), (1, 1700, 8.0), (2, 2450, 7.0), (3, 2049, 5.0)]
        banned = [(4, 7), (5, 2499), (6, 1030)]
        tensors = build(
            ROWS,
            VOCAB,
            temperature=temperatures,
            top_k=[0, 5, 40, 0] * (ROWS // 4),
            top_p=[1.0, 1.0, 0.8, 0.9] * (ROWS // 4),
            min_p=[0.0, 0.05, 0.0, 0.02] * (ROWS // 4),
            bias=local(bias),
            banned=local(banned),
            seeds=seeds,
            counters=7,
        )
        return {"logits": _logits(2, 4.0), "tensors": tensors}
    if name == "flat_top_p":  # mass spread over far more than the candidates
        tensors = build(ROWS, VOCAB, temperature=1.0, top_p=0.95, seeds=seeds)
        return {"logits": _logits(3, 0.1), "tensors": tensors}
    if name == "wide_top_k":
        tensors = build(ROWS, VOCAB, temperature=1.0, top_k=1000, seeds=seeds)
        return {"logits": _logits(4, 1.0), "tensors": tensors}
    generator = torch.Generator().manual_seed(5)
    drafts = torch.randint(0, VOCAB, (ROWS,), generator=generator)
    drafts[-1] = -1  # a bonus row
    logits = _logits(6, 2.0)
    logits[torch.arange(ROWS - 1), drafts[:-1]] += 3.0  # drafts often stand
    tensors = build(ROWS, VOCAB, temperature=temperatures, top_k=[0, 50] * 6, seeds=seeds)
    q = None
    if name == "verify_draft":
        q = torch.softmax(_logits(7, 2.0), dim=1)
    return {"logits": logits, "tensors": tensors, "drafts": drafts, "q": q}


def _run(sampler: Sampler, scenario: dict, start: int, stop: int) -> list:
    logits = scenario["logits"][:, start:stop]
    if "drafts" not in scenario:
        return sampler.sample(logits, scenario["tensors"]).tolist()
    q = scenario["q"]
    keeps, chosen = sampler.verify(
        logits, scenario["tensors"], scenario["drafts"], None if q is None else q[:, start:stop]
    )
    return [keeps.tolist(), chosen.tolist()]


def _worker(rank: int, world: int, directory: str) -> None:
    with gloo_rank(rank, world, directory) as results:
        start, stop = shard_range(VOCAB, world, rank)
        collectives = Collectives()
        lanes = ShardRows(VocabShard.of(VOCAB, rank, world, 1 << 30, "sampling"), collectives)
        sampler = Sampler(lanes)

        def compute(name: str) -> dict:
            before = lanes.gathered_rows
            chosen = _run(sampler, _scenario(name, start, stop), start, stop)
            return {"chosen": chosen, "gathered": lanes.gathered_rows - before}

        record_each(results, SCENARIOS, compute)
        results["widest"] = dict(collectives.tally.widest_row)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict:
    return spawn_worlds(_worker, (2, 3), tmp_path_factory)


@pytest.mark.slow
@pytest.mark.parametrize("name", SCENARIOS)
@pytest.mark.parametrize("world", [2, 3])
def test_every_rank_chooses_what_whole_rows_choose(outcomes, world, name):
    expected = _run(Sampler(), _scenario(name), 0, VOCAB)
    for rank in range(world):
        found = outcomes[world, rank][name]
        assert "error" not in found, found.get("error")
        assert found["chosen"] == expected


@pytest.mark.slow
def test_equal_maxima_in_several_shards_go_to_the_lowest_id(outcomes):
    assert outcomes[3, 2]["ties"]["chosen"] == [100 + row for row in range(ROWS)]


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_candidates_settle_top_k_top_p_and_min_p_without_gathering_rows(outcomes, world):
    for rank in range(world):
        results = outcomes[world, rank]
        for name in ("ties", "filters", "verify_history", "verify_draft"):
            assert results[name]["gathered"] == 0, name
        # The widest exchange is the cutoff's candidates plus the shard's (maximum, mass).
        assert results["widest"]["sampling"] == CUTOFF_CANDIDATES + 2


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_rows_the_candidates_cannot_settle_are_gathered_and_counted(outcomes, world):
    for rank in range(world):
        results = outcomes[world, rank]
        assert results["flat_top_p"]["gathered"] == ROWS
        assert results["wide_top_k"]["gathered"] == ROWS


def test_the_scenarios_draw_real_variety():
    # A guard on the guard: the filters scenario must not collapse to greedy choices.
    chosen = _run(Sampler(), _scenario("filters"), 0, VOCAB)
    greedy = _scenario("filters")["logits"].argmax(dim=1).tolist()
    assert chosen != greedy
    assert not math.isnan(sum(chosen))
