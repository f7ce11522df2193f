"""Tensor parallelism on 2 gloo ranks serves tiny Qwen3-MoE and DeepSeek-V3 as one rank does.

Experts split by shard (every rank holds 19 or 18 of each expert's 37 inner columns) and
DeepSeek's latent attention by query head (2 + 2, the latent cache whole on each rank).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from adapters.gpu.distributed.group import Rendezvous
from adapters.gpu.factory import ExecutorRecipe
from adapters.tokenizer.hf import HfTokenizer
from domain.contract.capabilities import LogprobCapability, scored_capacities
from domain.engine.engine import Engine, EngineConfig
from domain.logprobs.rules import LogprobAsk
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams
from tests.support import parallel_world as world
from tests.support.draining import drain, logprob_records
from tests.support.tiny_moe_serving import MOE_VOCAB, build_tiny_moe_model_dir

pytestmark = [pytest.mark.model, pytest.mark.slow]

BUDGET = 32
CAPABILITY = LogprobCapability(
    top_k=20, selects_ids=True, scored_capacities=scored_capacities(BUDGET)
)
# The bound of tests/integration/torch/test_tensor_parallel_engine.py: summation order differs
# between splits, so values agree to FP32 noise, not bit for bit.
SPLIT_NOISE = 5e-5


def _requests() -> list[EngineRequest]:
    generator = random.Random(3)
    prompts = [
        tuple(generator.randrange(3, MOE_VOCAB) for _ in range(length)) for length in (5, 19, 40)
    ]
    greedy = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    seeded = SamplingParams(temperature=0.8, max_tokens=12, ignore_eos=True, seed=7)
    top5 = LogprobAsk(wanted=True, count=5)
    requests = [
        EngineRequest(f"greedy{i}", p, greedy, logprobs=top5) for i, p in enumerate(prompts)
    ]
    requests.append(EngineRequest("seeded", prompts[1], seeded, logprobs=top5))
    scored = LogprobAsk(wanted=True, count=5, prompt_logprobs=5)
    requests.append(EngineRequest("scored", prompts[2], greedy, logprobs=scored))
    return requests


def _drive(executor, tokenizer: HfTokenizer) -> dict[str, Any]:
    config = EngineConfig(max_num_seqs=8, max_num_batched_tokens=BUDGET)
    drained = drain(Engine(executor, tokenizer, config), _requests())
    return {name: logprob_records(items) for name, items in drained.items()}


def _recipe(model_dir: Path, tensor_parallel_size: int) -> ExecutorRecipe:
    tokenizer = HfTokenizer.from_dir(model_dir)
    return ExecutorRecipe(
        model_dir, world.settings(tensor_parallel_size), tokenizer.vocab_size, capability=CAPABILITY
    )


def _rank_main(rendezvous: Rendezvous, directory: Path, model_dir: Path) -> None:
    if rendezvous.rank:
        world.peer(rendezvous, directory)
        return
    tokenizer = HfTokenizer.from_dir(model_dir)
    recipe = _recipe(model_dir, rendezvous.world_size)
    served = world.coordinate(rendezvous, recipe, lambda executor: _drive(executor, tokenizer))
    world.save(directory, "served", served)


@pytest.fixture(scope="module", params=["qwen3-moe", "deepseek-v3"])
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(one rank's outputs, two ranks' outputs) of one family."""
    family = request.param
    model_dir = build_tiny_moe_model_dir(
        tmp_path_factory.mktemp(family), family, moe_intermediate_size=37
    )
    single = _drive(_recipe(model_dir, 1).build(), HfTokenizer.from_dir(model_dir))
    directory = tmp_path_factory.mktemp(f"{family}-tp2")
    world.spawn_world(2, directory, _rank_main, model_dir)
    return single, world.load(directory, "served")


def _close(left: list, right: list) -> bool:
    return all(
        a[0] == b[0] and abs(a[1] - b[1]) <= SPLIT_NOISE for a, b in zip(left, right, strict=True)
    )


def test_two_ranks_generate_the_tokens_of_one_rank(runs) -> None:
    single, split = runs
    for name, outputs in single.items():
        assert len(outputs["tokens"]) >= 12
        assert split[name]["tokens"] == outputs["tokens"], name


def test_two_ranks_report_the_ids_of_one_rank_and_values_within_split_noise(runs) -> None:
    single, split = runs
    checked = 0
    for name, outputs in single.items():
        for field in ("entries", "prompt"):
            mine, theirs = split[name][field], outputs[field]
            assert len(mine) == len(theirs), (name, field)
            for left, right in zip(mine, theirs, strict=True):
                assert [p[0] for p in left] == [p[0] for p in right], (name, field)
                assert _close(left, right), (name, field)
                checked += 1
    assert checked > 60
