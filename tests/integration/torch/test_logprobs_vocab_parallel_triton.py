"""Triton vocabulary-parallel logprobs on 2 and 3 gloo ranks equal the torch stages exactly."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from adapters.gpu.logprobs.normalizer import LSE_TILE
from adapters.gpu.logprobs.reducer import ReductionInputs
from adapters.gpu.logprobs.reference_reducer_vp import EXCHANGE_WORDS, VocabParallelLogprobReducer
from tests.integration.torch.test_logprobs_vocab_parallel import (
    SCENARIOS,
    SENTINEL,
    UNEVEN,
    Scenario,
    _random,
    _reference,
    _shard,
)
from tests.support.gloo import gloo_rank, record_each, spawn_worlds
from tests.support.triton_interpreter import patch_language_once_per_launch

pytestmark = pytest.mark.slow

WORLD_SIZES = (2, 3)
# 130 tiles: 65 per shard on 2 ranks, so exchange 1's pairs reach past every word that
# exchange 2 writes (keys and values end at word 96, selected logits at 128).
WIDE = 130 * LSE_TILE - 9


def _wide_shards() -> Scenario:
    generator = torch.Generator().manual_seed(17)
    logits = torch.randn(2, WIDE, generator=generator) * 3.0
    return Scenario(
        vocab=WIDE,
        logits=logits,
        rows=[(0, 0, 5), (1, 0, WIDE - 2)],
        requests={0: None, 1: [WIDE - 1, 70_000, 3, 66_600, 99_000, WIDE]},
        capacity=2,
    )


def _natural_few() -> Scenario:
    """Natural rows over the selecting scenario's vocabulary: both share one reducer."""
    rows = [(0, 0, 1023), (2, 0, 1024), (3, 1, 4099)]
    return Scenario(
        vocab=UNEVEN,
        logits=_random(len(rows), UNEVEN, 7, torch.float32),
        rows=rows,
        requests={0: None, 2: None, 3: None},
        capacity=4,
        tokens=2,
    )


# Few rows and few tiles keep the interpreter cheap while covering every exchange path: mixed
# natural lanes (bf16; fp32 in the selected and repeated runs), 1 and 128 selected IDs, ties
# across shards, empty shards.
CASES = {
    **{
        name: SCENARIOS[name]
        for name in (
            "natural_bf16",
            "selected_fp32",
            "ties_bf16",
            "two_tiles_bf16",
            "vocab_5_full",
            "one_finite_shard",
            "nobody_requests",
        )
    },
    "wide_shards": _wide_shards,
}
NAMES = tuple(CASES)
# The wide scenario is sized for two shards; three ranks run the rest.
WORLD_NAMES = {2: NAMES, 3: tuple(name for name in NAMES if name != "wide_shards")}


def _run(scenario: Scenario, world: int, rank: int, reducer) -> dict:
    """This rank's packed output, each all-gather's (shape, dtype, ranks) and words sent."""
    calls: list[list] = []
    sent: list[list[int]] = []
    original = dist.all_gather

    def counting(tensor_list, tensor, group=None, async_op=False):
        calls.append([list(tensor.shape), str(tensor.dtype), len(tensor_list)])
        sent.append(tensor.view(torch.int32).flatten().tolist())
        return original(tensor_list, tensor, group=group, async_op=async_op)

    out, requested, counts, token_ids = scenario.frame()
    slots, positions, chosen = scenario.columns()
    shard = _shard(scenario.logits, scenario.vocab, world, rank)
    before = shard.clone()
    dist.all_gather = counting
    try:
        reducer.reduce(
            ReductionInputs(shard, slots, positions, chosen, requested, counts, token_ids, out)
        )
    finally:
        dist.all_gather = original
    untouched = torch.equal(shard.view(torch.uint8), before.view(torch.uint8))
    return {
        "out": out.flatten().tolist(),
        "calls": calls,
        "sent": sent,
        "shard_untouched": untouched,
    }


def _repeated(world: int, rank: int, reducer_type: type) -> list[dict]:
    """Natural, selecting, natural calls through one reducer: the later ones reuse workspaces."""
    selected, natural = SCENARIOS["selected_fp32"](), _natural_few()
    reducer = reducer_type(natural.vocab, natural.top_k, rank, world)
    return [_run(scenario, world, rank, reducer) for scenario in (natural, selected, natural)]


def _worker(rank: int, world: int, directory: str) -> None:
    # Gloo ranks hold CPU tensors, so the kernels run in Triton's interpreter even beside a GPU;
    # it must be chosen before triton is imported.
    os.environ["TRITON_INTERPRET"] = "1"
    from adapters.gpu.logprobs.triton_reducer_vp import TritonVocabParallelLogprobReducer

    patch_language_once_per_launch()

    reducers = {"torch": VocabParallelLogprobReducer, "triton": TritonVocabParallelLogprobReducer}

    def both(name: str) -> dict:
        scenario = CASES[name]()
        shape = (scenario.vocab, scenario.top_k)
        return {
            kind: _run(scenario, world, rank, build(*shape, rank, world))
            for kind, build in reducers.items()
        }

    with gloo_rank(rank, world, directory, timeout_s=60) as results:
        record_each(results, WORLD_NAMES[world], both)
        record_each(
            results,
            ["repeated"],
            lambda _: _repeated(world, rank, TritonVocabParallelLogprobReducer),
        )


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[tuple[int, int], dict]:
    """(world, rank) -> scenario name -> each reducer's result, from one spawn per world."""
    return spawn_worlds(_worker, WORLD_SIZES, tmp_path_factory)


def _outputs(outcomes, name: str, which: str) -> list[tuple[int, int, torch.Tensor]]:
    shape = CASES[name]().frame()[0].shape
    produced = []
    for (world, rank), results in outcomes.items():
        if name not in WORLD_NAMES[world]:
            continue
        result = results[name]
        assert "error" not in result, f"world {world} rank {rank}:\n{result['error']}"
        assert result[which]["shard_untouched"], (name, world, rank)
        out = torch.tensor(result[which]["out"], dtype=torch.int32).view(shape)
        produced.append((world, rank, out))
    return produced


@pytest.mark.parametrize("name", NAMES)
def test_the_triton_ranks_write_the_torch_stages_packed_words_exactly(outcomes, name) -> None:
    expected = _reference(CASES[name]())
    staged = _outputs(outcomes, name, "torch")
    for (world, rank, got), (_, _, torch_got) in zip(
        _outputs(outcomes, name, "triton"), staged, strict=True
    ):
        # IDs, FP32 bits, -1 padding and untouched sentinels alike, word for word.
        differing = (got != torch_got).nonzero().tolist()
        assert not differing, (name, world, rank, differing[:4])
        assert torch.equal(got, expected), (name, world, rank)


def test_each_of_the_two_exchanges_carries_256_fp32_words_per_row_per_rank(outcomes) -> None:
    for name in NAMES:
        rows = len(CASES[name]().rows)
        for (world, rank), results in outcomes.items():
            if name not in WORLD_NAMES[world]:
                continue
            expected = [[rows, EXCHANGE_WORDS], "torch.float32", world]
            assert results[name]["triton"]["calls"] == [expected, expected], (name, world, rank)


@pytest.mark.parametrize("name", NAMES)
def test_requesting_rows_send_the_torch_stages_payload_words_exactly(outcomes, name) -> None:
    # The torch stages send the requesting rows only; the Triton ranks send every row, so the
    # payloads agree row for row on the requesting ones, reserved zero words included.
    scenario = CASES[name]()
    requesting = [index for index, row in enumerate(scenario.rows) if row[0] in scenario.requests]
    for (world, rank), results in outcomes.items():
        if name not in WORLD_NAMES[world]:
            continue
        staged, prepared = results[name]["torch"]["sent"], results[name]["triton"]["sent"]
        assert len(staged) == len(prepared) or not requesting, (name, world, rank)
        for exchange, (words, all_words) in enumerate(zip(staged, prepared, strict=False)):
            rows = torch.tensor(all_words, dtype=torch.int32).view(-1, EXCHANGE_WORDS)
            expected = torch.tensor(words, dtype=torch.int32).view(-1, EXCHANGE_WORDS)
            got = rows[requesting]
            differing = (got != expected).nonzero().tolist()
            assert not differing, (name, world, rank, exchange, differing[:4])


def test_rows_without_a_request_are_never_written_though_their_words_travel(outcomes) -> None:
    for _, _, got in _outputs(outcomes, "nobody_requests", "triton"):
        assert set(got.flatten().tolist()) == {SENTINEL}


def test_a_reducer_reused_after_a_selection_stays_exact_and_resends_no_stale_word(
    outcomes,
) -> None:
    # Selected rows fill words 96..127 that natural rows leave zero, so a stale word would show.
    natural = _natural_few()
    requesting = [index for index, row in enumerate(natural.rows) if row[0] in natural.requests]
    for (world, rank), results in outcomes.items():
        repeated = results["repeated"]
        assert "error" not in repeated, f"world {world} rank {rank}:\n{repeated['error']}"
        runs = (_natural_few, SCENARIOS["selected_fp32"], _natural_few)
        for index, (run, produced) in enumerate(zip(runs, repeated, strict=True)):
            expected = _reference(run())
            assert produced["out"] == expected.flatten().tolist(), (index, world, rank)
        # The first natural call ran on fresh workspaces; the third must send the same words.
        fresh = repeated[0]["sent"]
        for again, first in zip(repeated[2]["sent"], fresh, strict=True):
            again = torch.tensor(again).view(-1, EXCHANGE_WORDS)[requesting]
            first = torch.tensor(first).view(-1, EXCHANGE_WORDS)[requesting]
            assert torch.equal(again, first), (world, rank)
