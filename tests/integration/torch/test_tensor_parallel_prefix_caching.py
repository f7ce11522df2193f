"""Prefix caching under tensor parallelism: every rank reads the shared blocks the plan's
tables name, so requests that hit the cache on two ranks get one rank's uncached tokens, with
values within the split's rounding."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from adapters.gpu.distributed.group import Rendezvous
from adapters.gpu.factory import ExecutorRecipe
from adapters.tokenizer.hf import HfTokenizer
from domain.emission.outputs import ChoiceDelta, RequestEnd
from domain.engine.engine import Engine, EngineConfig
from domain.logprobs.rules import LogprobAsk
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams
from tests.support import parallel_world as world
from tests.support.draining import drain
from tests.support.tiny_serving import build_parallel_model_dir

pytestmark = [pytest.mark.slow, pytest.mark.model]

SYSTEM = "you are a careful assistant; answer in a few words and say why. "
QUESTIONS = ("what is red", "name a fruit", "what is red")
SPLIT_NOISE = 1.5e-5


def _wave(tokenizer: HfTokenizer, names: tuple[str, ...], n: int = 1) -> list[EngineRequest]:
    greedy = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    ask = LogprobAsk(wanted=True, count=3)
    return [
        EngineRequest(name, tuple(tokenizer.encode(SYSTEM + text)), greedy, n=n, logprobs=ask)
        for name, text in zip(names, QUESTIONS, strict=False)
    ]


def _drive(executor, tokenizer: HfTokenizer, caching: str | None) -> dict[str, Any]:
    config = EngineConfig(max_num_seqs=8, max_num_batched_tokens=32, prefix_caching=caching)
    engine = Engine(executor, tokenizer, config)
    found: dict[str, Any] = {}
    waves = [_wave(tokenizer, ("first",)), _wave(tokenizer, ("a", "b", "c"), n=2)]
    for wave in waves:
        for name, items in drain(engine, wave).items():
            choices: dict[int, list] = {}
            for item in items:
                if isinstance(item, ChoiceDelta):
                    tokens, values = choices.setdefault(item.index, [[], []])
                    tokens += item.token_ids
                    values += [e.position.chosen.logprob for e in item.logprobs]
            end = items[-1]
            assert isinstance(end, RequestEnd) and end.error is None
            found[name] = (choices, end.usage.cached_tokens)
    return found


def _rank_main(rendezvous: Rendezvous, directory: Path, model_dir: Path, name: str) -> None:
    if rendezvous.rank:
        world.peer(rendezvous, directory)
        return
    tokenizer = HfTokenizer.from_dir(model_dir)
    recipe = ExecutorRecipe(model_dir, world.settings(rendezvous.world_size), tokenizer.vocab_size)
    caching = "sha256" if rendezvous.world_size > 1 else None
    served = world.coordinate(
        rendezvous, recipe, lambda executor: _drive(executor, tokenizer, caching)
    )
    world.save(directory, name, served)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[dict[str, Any], dict[str, Any]]:
    model_dir = build_parallel_model_dir(tmp_path_factory.mktemp("parallel-model"))
    directory = tmp_path_factory.mktemp("tp-prefix")
    world.spawn_world(1, directory, _rank_main, model_dir, "single")
    world.spawn_world(2, directory, _rank_main, model_dir, "split")
    return world.load(directory, "single"), world.load(directory, "split")


def test_two_ranks_reading_cached_blocks_serve_one_uncached_rank_s_tokens(runs):
    single, split = runs

    for name, (choices, _) in single.items():
        found = split[name][0]
        assert {i: c[0] for i, c in found.items()} == {i: c[0] for i, c in choices.items()}, name
        for index, (_, values) in choices.items():
            for mine, reference in zip(found[index][1], values, strict=True):
                assert abs(mine - reference) <= SPLIT_NOISE * (1 + abs(reference)), name
    assert split["first"][1] == 0
    assert all(split[name][1] > 0 for name in ("a", "b", "c"))
