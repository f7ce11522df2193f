"""Routing is a property of the row: ties go to the lowest expert, and the batch changes nothing."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from adapters.gpu.loading.weights import load_model
from adapters.gpu.model.decoder import DecoderModel
from adapters.gpu.model.experts import RoutedExperts, top_indices
from adapters.gpu.model.forward_batch import ForwardBatch, SequenceChunk
from adapters.gpu.model.kv_cache import PagedKVCache
from adapters.gpu.model.moe_config import ExpertsSettings
from tests.support import family_checks as checks
from tests.support.tiny_moe_models import build_tiny_deepseek_v3, build_tiny_qwen3_moe

VOCAB_SIZE = 320
BLOCK_SIZE = 4
NUM_BLOCKS = 160
DEVICE = torch.device("cpu")
BATCH = 16
DECODE_STEPS = 3


def test_ties_go_to_the_lowest_index_whatever_the_row_holds() -> None:
    values = torch.tensor([[0.5, 0.9, 0.9, 0.1, 0.9], [0.2, 0.2, 0.2, 0.2, 0.2]])

    assert top_indices(values, 2).tolist() == [[1, 2], [0, 1]]
    assert top_indices(values, 4).tolist() == [[1, 2, 4, 0], [0, 1, 2, 3]]


def _experts(settings: ExpertsSettings) -> RoutedExperts:
    experts = RoutedExperts(settings, 4, torch.float32, DEVICE)
    with torch.no_grad():
        experts.router_weight.zero_()
        if experts.correction_bias is not None:
            experts.correction_bias.zero_()
    return experts


def _grouped_sigmoid(**settings: Any) -> ExpertsSettings:
    """DeepSeek-V3's routing of one sparse layer: sigmoid scores with a correction bias, the
    best 2 groups kept; `settings` give the rest."""
    return ExpertsSettings(
        inner=3,
        sparse_layers=(True,),
        scoring="sigmoid",
        top_groups=2,
        correction_bias=True,
        **settings,
    )


def test_a_router_that_scores_every_expert_alike_picks_the_lowest_indices() -> None:
    """All-zero router weights tie every expert: softmax routing picks experts 0 and 1 with
    equal weights; grouped sigmoid routing keeps the lowest groups, then their lowest experts."""
    rows = torch.randn(5, 4)
    softmax = _experts(ExpertsSettings(num_experts=6, top_k=2, inner=3, sparse_layers=(True,)))
    grouped = _experts(_grouped_sigmoid(num_experts=8, top_k=3, groups=4, scaling=2.5))

    experts, weights = softmax.route(rows)
    grouped_experts, grouped_weights = grouped.route(rows)

    assert experts.tolist() == [[0, 1]] * 5
    assert torch.equal(weights, torch.full((5, 2), 0.5))
    assert grouped_experts.tolist() == [[0, 1, 2]] * 5
    assert torch.allclose(grouped_weights, torch.full((5, 3), 2.5 / 3))


def test_group_limited_routing_never_picks_an_expert_of_a_dropped_group() -> None:
    """Group 1 holds the single best expert but a weak partner; groups 0 and 2 have better
    best-two sums, so DeepSeek's rule keeps them and routes past the best expert."""
    experts = _experts(_grouped_sigmoid(num_experts=6, top_k=2, groups=3, normalize=False))
    logits = torch.tensor([1.0, 1.2, 3.0, -4.0, 0.9, 1.1])
    with torch.no_grad():
        experts.router_weight.copy_(torch.zeros(6, 4))
        experts.router_weight[:, 0] = logits

    chosen, weights = experts.route(torch.tensor([[1.0, 0.0, 0.0, 0.0]]))

    assert chosen.tolist() == [[1, 5]]
    assert torch.allclose(weights, torch.sigmoid(logits[[1, 5]])[None])


@pytest.fixture(scope="module", params=["qwen3-moe", "deepseek-v3"])
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    builder = build_tiny_qwen3_moe if request.param == "qwen3-moe" else build_tiny_deepseek_v3
    return builder(tmp_path_factory.mktemp(request.param), vocab_size=VOCAB_SIZE)


def _generate(
    model: DecoderModel, prompts: list[list[int]], watched: int
) -> tuple[list[list[torch.Tensor]], list[torch.Tensor]]:
    """Prefills `prompts` in one forward, then decodes DECODE_STEPS greedy tokens for all of
    them; returns the experts each sparse layer chose for prompt `watched`'s rows per forward,
    and its logits rows per forward."""
    cache = PagedKVCache.allocate(model.config, NUM_BLOCKS, BLOCK_SIZE, torch.float32, DEVICE)
    logs = checks.routing_logs(model)
    pool = iter(random.Random(len(prompts)).sample(range(NUM_BLOCKS), NUM_BLOCKS))
    tables = [
        tuple(next(pool) for _ in range(-(-(len(p) + DECODE_STEPS) // BLOCK_SIZE))) for p in prompts
    ]
    chunks = [SequenceChunk(tuple(p), 0, table) for p, table in zip(prompts, tables, strict=True)]
    spans = []
    logits = []
    for _ in range(DECODE_STEPS + 1):
        batch = ForwardBatch.build(chunks, BLOCK_SIZE, DEVICE)
        rows = model.compute_logits(model(batch, cache))
        first = sum(len(chunk.token_ids) for chunk in chunks[:watched])
        span = (first, first + len(chunks[watched].token_ids))
        spans.append(span)
        logits.append(rows[span[0] : span[1]])
        ends = batch.last_rows.tolist()
        chunks = [
            SequenceChunk(
                (int(rows[end].argmax()),), chunk.start_position + len(chunk.token_ids), table
            )
            for chunk, end, table in zip(chunks, ends, tables, strict=True)
        ]
    routed = [[log[step][a:b] for step, (a, b) in enumerate(spans)] for log in logs]
    return routed, logits


@pytest.mark.model
@pytest.mark.parametrize("invariant", [False, True], ids=["default", "batch-invariant"])
def test_a_prompt_alone_and_inside_a_batch_of_16_routes_every_token_alike(
    checkpoint: Path, invariant: bool
) -> None:
    """The watched prompt's prefill and decode rows pick the same experts in every sparse
    layer alone and as the 7th of 16 prompts of other lengths; with the batch-invariant
    kernels its logits are the same bits too."""
    model = load_model(checkpoint, dtype=torch.float32, device=DEVICE, batch_invariant=invariant)
    rng = random.Random(7)
    prompts = [
        [rng.randrange(VOCAB_SIZE) for _ in range(rng.randrange(3, 30))] for _ in range(BATCH)
    ]
    watched = 6

    alone, alone_logits = _generate(model, [prompts[watched]], 0)
    together, together_logits = _generate(model, prompts, watched)

    for layer_alone, layer_together in zip(alone, together, strict=True):
        for step_alone, step_together in zip(layer_alone, layer_together, strict=True):
            assert torch.equal(step_alone, step_together)
    if invariant:
        for a, b in zip(alone_logits, together_logits, strict=True):
            assert torch.equal(a, b)
