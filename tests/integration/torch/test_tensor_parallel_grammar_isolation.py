"""Grammars under tensor parallelism fail their own request only: a grammar that breaks while
it runs, one that compiles slowly on a peer and one that breaks on a peer alone leave the world
serving, and the requests beside them get the tokens they get alone."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from adapters.gpu.distributed.group import Rendezvous
from adapters.gpu.factory import ExecutorRecipe
from adapters.grammar.llguidance_compiler import LlguidanceCompiler
from adapters.tokenizer.hf import HfTokenizer
from domain.emission.outputs import ChoiceDelta
from domain.engine.engine import Engine, EngineConfig
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams
from domain.structured.grammar import GrammarKind, GrammarSpec
from tests.support import parallel_world as world
from tests.support.breaking_grammars import row_explosion_grammar
from tests.support.draining import drain
from tests.support.tiny_serving import build_parallel_model_dir

BREAKING = GrammarSpec(GrammarKind.GRAMMAR, row_explosion_grammar(), "structured_outputs")
# Slow to compile on the peer: longer than the admission's time bound (which the peer's
# compiler would have, were it not told otherwise).
SLOW = GrammarSpec(GrammarKind.CHOICE, json.dumps(["bako lemi", "slow tu"]), "response_format")
# Breaks on the peer alone (its compile raises there): every rank must still retire it.
PEER_ONLY = GrammarSpec(GrammarKind.REGEX, "[a-z]{2,5} peeronly", "structured_outputs")
PEER_TIMEOUT_S = 0.2
SLOW_S = 0.8
TEXTS = ("the quick brown fox", "bako lemi tu sira", "every request gets its own slot")


def _innocents(tokenizer: HfTokenizer) -> list[EngineRequest]:
    greedy = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    seeded = SamplingParams(temperature=0.8, max_tokens=20, ignore_eos=True, seed=3)
    return [
        EngineRequest(f"innocent{i}", tuple(tokenizer.encode(t)), greedy if i % 2 else seeded)
        for i, t in enumerate(TEXTS)
    ]


def _constrained(tokenizer: HfTokenizer) -> list[EngineRequest]:
    prompt = tuple(tokenizer.encode("yes or no"))
    params = SamplingParams(temperature=0.0, max_tokens=20)
    return [
        EngineRequest(name, prompt, params, grammar=spec)
        for name, spec in (("breaking", BREAKING), ("slow", SLOW), ("peer-only", PEER_ONLY))
    ]


def _tokens(items: list) -> list[int]:
    return [t for item in items if isinstance(item, ChoiceDelta) for t in item.token_ids]


def _drive(executor, tokenizer: HfTokenizer) -> dict[str, Any]:
    def engine() -> Engine:
        config = EngineConfig(max_num_seqs=8, max_num_batched_tokens=32)
        return Engine(executor, tokenizer, config, grammars=LlguidanceCompiler(tokenizer))

    alone = drain(engine(), _innocents(tokenizer))
    mixed = drain(
        engine(),
        [*_constrained(tokenizer), *_innocents(tokenizer)],
        failing={"breaking", "peer-only"},
    )
    return {
        "alone": {name: _tokens(items) for name, items in alone.items()},
        "mixed": {name: _tokens(items) for name, items in mixed.items()},
        "ends": {name: items[-1] for name, items in mixed.items()},
        "failure": executor.failure,
    }


def _slow_and_failing_on_this_peer() -> None:
    """This peer's compiles: SLOW takes SLOW_S, PEER_ONLY raises; a compiler built without a
    time bound of its own gets PEER_TIMEOUT_S."""
    build = LlguidanceCompiler._build  # noqa: SLF001

    def peer_build(compiler: LlguidanceCompiler, spec: GrammarSpec):
        if spec == SLOW:
            time.sleep(SLOW_S)
        if spec == PEER_ONLY:
            raise RuntimeError("this peer cannot build the grammar")
        return build(compiler, spec)

    LlguidanceCompiler._build = peer_build  # type: ignore[method-assign]  # noqa: SLF001
    defaults = LlguidanceCompiler.__init__.__kwdefaults__
    assert defaults is not None
    defaults["timeout_s"] = PEER_TIMEOUT_S


def _rank_main(rendezvous: Rendezvous, directory: Path, model_dir: Path) -> None:
    if rendezvous.rank:
        _slow_and_failing_on_this_peer()
        world.peer(rendezvous, directory)
        return
    tokenizer = HfTokenizer.from_dir(model_dir)
    recipe = ExecutorRecipe(
        model_dir,
        world.settings(rendezvous.world_size),
        tokenizer.vocab_size,
        structured_outputs=True,
    )
    served = world.coordinate(rendezvous, recipe, lambda executor: _drive(executor, tokenizer))
    world.save(directory, "served", served)


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> tuple[dict[str, Any], Path]:
    model_dir = build_parallel_model_dir(tmp_path_factory.mktemp("parallel-model"))
    directory = tmp_path_factory.mktemp("tp2-grammars")
    world.spawn_world(2, directory, _rank_main, model_dir)
    return world.load(directory, "served"), directory


@pytest.mark.slow
@pytest.mark.model
def test_grammar_failures_under_two_ranks_fail_only_their_own_requests(served):
    results, directory = served

    assert results["failure"] is None, "the world stayed whole"
    for name, tokens in results["alone"].items():
        assert results["mixed"][name] == tokens, name
    ends = results["ends"]
    assert ends["breaking"].error_param == "structured_outputs"
    assert "2000" in ends["breaking"].error
    assert ends["peer-only"].error_param == "structured_outputs"
    assert "rank 1" in ends["peer-only"].error
    assert "cannot build" not in ends["peer-only"].error, "a peer's own text stays on the peer"
    # The grammar that compiled slowly on the peer was served in full.
    assert ends["slow"].error is None and results["mixed"]["slow"]
    # The peer ran every plan and left when rank 0 stopped it.
    assert world.load(directory, "tally1").calls["retired lanes"] > 0
