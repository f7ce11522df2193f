"""Prompt scoring on two gloo ranks for a vocabulary of 151,936 IDs (Qwen2.5's), as one rank.

Each rank's shard holds 75 normalizer tiles, more than the scoring exchange carries one pair per
tile (31): before runs of tiles were sent as one pair, `--prompt-logprobs -tp 2` refused such
a model at start. The model is tiny everywhere else (one layer, hidden size 16, tied
embeddings, as Qwen2.5's small models tie them).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from adapters.gpu.distributed.group import Rendezvous
from adapters.gpu.distributed.shards import shard_range
from adapters.gpu.factory import ExecutorRecipe
from adapters.gpu.scoring.prompt_scorer_vp import EXCHANGED_PAIRS
from adapters.tokenizer.hf import HfTokenizer
from domain.contract.capabilities import LogprobCapability, scored_capacities
from domain.engine.engine import Engine, EngineConfig
from domain.logprobs.rules import LogprobAsk
from domain.logprobs.values import NATURAL_TOP_K
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams
from tests.support import parallel_world as world
from tests.support.draining import drain, logprob_records
from tests.support.tiny_models import build_tiny_qwen2
from tests.support.tokenizers import build_listed_byte_level

pytestmark = [pytest.mark.slow, pytest.mark.model]

WIDE_VOCAB = 151_936
BUDGET = 32
# As in test_tensor_parallel_engine.py: the splits sum in other orders, so values agree to FP32
# noise, not bit for bit.
SPLIT_NOISE = 5e-5


def _build(directory: Path) -> Path:
    shape = {
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 8,
    }
    build_tiny_qwen2(directory, vocab_size=WIDE_VOCAB, seed=3, tie_word_embeddings=True, **shape)
    build_listed_byte_level(directory, vocab_size=WIDE_VOCAB)
    return directory


def _recipe(model_dir: Path, tensor_parallel_size: int) -> ExecutorRecipe:
    capability = LogprobCapability(
        top_k=NATURAL_TOP_K, selects_ids=True, scored_capacities=scored_capacities(BUDGET)
    )
    # The tokenizer has exactly WIDE_VOCAB IDs (`build_listed_byte_level` checks it).
    settings = world.settings(tensor_parallel_size, max_model_len=32)
    return ExecutorRecipe(model_dir, settings, WIDE_VOCAB, capability=capability)


def _prompt() -> tuple[int, ...]:
    # IDs from every part of the vocabulary, so targets fall in both shards.
    generator = random.Random(11)
    return tuple(generator.randrange(4, WIDE_VOCAB) for _ in range(24))


def _drive(executor, model_dir: Path) -> dict[str, Any]:
    """A scored request with echo, then a few generated tokens with their top 3."""
    tokenizer = HfTokenizer.from_dir(model_dir)
    engine = Engine(
        executor, tokenizer, EngineConfig(max_num_seqs=4, max_num_batched_tokens=BUDGET)
    )
    ask = LogprobAsk(wanted=True, count=3, prompt_logprobs=NATURAL_TOP_K, echo=True)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    (items,) = drain(engine, [EngineRequest("scored", _prompt(), params, logprobs=ask)]).values()
    return logprob_records(items, ranks=True)


def _rank_main(rendezvous: Rendezvous, directory: Path, model_dir: Path) -> None:
    if rendezvous.rank:
        world.peer(rendezvous, directory)
        return
    recipe = _recipe(model_dir, rendezvous.world_size)
    served = world.coordinate(rendezvous, recipe, lambda executor: _drive(executor, model_dir))
    world.save(directory, "served", served)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return _build(tmp_path_factory.mktemp("wide-vocabulary"))


def _close(left: list, right: list) -> bool:
    return all(
        a[0] == b[0] and abs(a[1] - b[1]) <= SPLIT_NOISE for a, b in zip(left, right, strict=True)
    )


def test_prompt_scores_of_a_151936_token_vocabulary_on_two_ranks_equal_one_rank(
    model_dir, tmp_path
):
    shard_tiles = -(-shard_range(WIDE_VOCAB, 2, 0)[1] // 1024)
    assert shard_tiles > EXCHANGED_PAIRS  # the case that used to be refused
    single = _drive(_recipe(model_dir, 1).build(), model_dir)

    world.spawn_world(2, tmp_path, _rank_main, model_dir)
    served = world.load(tmp_path, "served")

    assert len(served["prompt"]) == len(single["prompt"]) == len(_prompt()) - 1
    for row, reference in zip(served["prompt"], single["prompt"], strict=True):
        assert row[0][0] == reference[0][0] and row[0][2] == reference[0][2]  # target, rank
        assert abs(row[0][1] - reference[0][1]) <= SPLIT_NOISE
        assert len(row) == 1 + NATURAL_TOP_K and _close(row[1:], reference[1:])
    assert {row[0][2] for row in single["prompt"]} != {1}  # ranks other than first do occur
    assert served["tokens"] == single["tokens"]
    for mine, theirs in zip(served["entries"], single["entries"], strict=True):
        assert _close(mine, theirs)
