"""Qwen3, Phi-3 (fused projections cut per rank) and Gemma 3 split over two gloo ranks decode
the tokens one rank decodes, with logits within the tensor-parallel bound."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from adapters.gpu.distributed.collectives import Collectives
from adapters.gpu.distributed.split import split_model
from adapters.gpu.loading.weights import load_model
from adapters.gpu.model.config import ModelConfig
from adapters.gpu.model.forward_batch import SequenceChunk
from tests.support import family_checks as checks
from tests.support.gloo import gloo_rank, record_each, spawn_worlds
from tests.support.tiny_models import build_tiny_gemma3, build_tiny_phi3, build_tiny_qwen3

pytestmark = [pytest.mark.model, pytest.mark.slow]

FAMILIES = {
    "qwen3": lambda d: build_tiny_qwen3(d, vocab_size=checks.VOCAB, seed=4),
    "phi3": lambda d: build_tiny_phi3(d, vocab_size=checks.VOCAB, seed=5, sliding_window=8),
    "gemma3": lambda d: build_tiny_gemma3(d, vocab_size=checks.VOCAB, seed=6),
}
# As tests/integration/torch/test_tensor_parallel_engine.py: split sums round differently.
SPLIT_NOISE = 5e-5
PROMPT = checks.random_tokens(24, seed=3)
STEPS = 16
_MODELS = "tp-families"


def _greedy(model, collectives: Collectives) -> dict:
    """Greedy tokens over the paged cache and every sampled row's whole-vocabulary logits."""
    tokens = list(PROMPT)
    blocks = checks.blocks_for(len(PROMPT) + STEPS, seed=0)
    cache = checks.new_cache(model)
    rows = []
    chunk = SequenceChunk(tuple(tokens), 0, blocks)
    for _ in range(STEPS + 1):
        lanes = checks.run(model, [chunk], cache)[-1]
        gathered: list = [None] * collectives.world_size
        dist.all_gather_object(gathered, lanes)
        row = torch.cat(gathered)[: checks.VOCAB]
        rows.append(row.tolist())
        tokens.append(int(row.argmax()))
        chunk = SequenceChunk((tokens[-1],), len(tokens) - 1, blocks)
    return {"tokens": tokens[len(PROMPT) : -1], "rows": rows[:-1]}


def _worker(rank: int, world: int, directory: str) -> None:
    models = Path(directory).parent / _MODELS
    with gloo_rank(rank, world, directory) as results:
        collectives = Collectives()

        def compute(family: str) -> dict:
            model_dir = models / family
            config = ModelConfig.from_dir(model_dir)
            split = split_model(config, world, checks.VOCAB)[rank]
            model = load_model(
                model_dir, dtype=torch.float32, device="cpu", split=split, collectives=collectives
            )
            return _greedy(model, collectives)

        record_each(results, sorted(FAMILIES), compute)


@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory) -> dict:
    models = tmp_path_factory.getbasetemp() / _MODELS
    for family, build in FAMILIES.items():
        build(models / family)
    return spawn_worlds(_worker, (1, 2), tmp_path_factory)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_two_ranks_decode_the_tokens_of_one_rank_within_the_split_bound(
    worlds: dict, family: str
) -> None:
    single = worlds[1, 0][family]
    assert "error" not in single, single.get("error")
    for rank in range(2):
        split = worlds[2, rank][family]
        assert "error" not in split, split.get("error")
        assert split["tokens"] == single["tokens"]
        difference = checks.max_difference(
            torch.tensor(split["rows"]), torch.tensor(single["rows"])
        )
        assert difference <= SPLIT_NOISE, f"{family} rank {rank}: {difference:.3g}"
    assert len(set(single["tokens"])) >= 3
