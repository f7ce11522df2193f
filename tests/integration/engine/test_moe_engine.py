"""The real engine on tiny Qwen3-MoE, Mixtral and DeepSeek-V3: tokens, logprobs and prompt
scores equal transformers' greedy continuation and float64 log_softmax of its logits."""

from __future__ import annotations

import random

import pytest
import torch
import transformers

from domain.contract.capabilities import LogprobCapability, scored_capacities
from domain.emission.outputs import ChoiceDelta, PromptScores
from domain.logprobs.rules import LogprobAsk
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams
from tests.support.draining import drain
from tests.support.engines import build_engine
from tests.support.tiny_moe_serving import MOE_BUILDERS, MOE_VOCAB, build_tiny_moe_model_dir

pytestmark = pytest.mark.model

NEW_TOKENS = 64
PROMPT_LENGTH = 23
ATOL = 1e-4
BUDGET = 32
# Mixtral's window is shorter than the prompt and the continuation.
OVERRIDES = {"mixtral": {"sliding_window": 8}}


@pytest.fixture(scope="module", params=sorted(MOE_BUILDERS))
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(transformers' float32 model, prompt, the engine's items for the greedy request)."""
    family = request.param
    directory = build_tiny_moe_model_dir(
        tmp_path_factory.mktemp(family), family, **OVERRIDES.get(family, {})
    )
    capability = LogprobCapability(
        top_k=20, selects_ids=True, scored_capacities=scored_capacities(BUDGET)
    )
    engine, _, _ = build_engine(directory, budget=BUDGET, max_model_len=128, capability=capability)
    prompt = tuple(random.Random(9).randrange(3, MOE_VOCAB) for _ in range(PROMPT_LENGTH))
    greedy = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    ask = LogprobAsk(wanted=True, count=5, prompt_logprobs=5)
    items = drain(engine, [EngineRequest("greedy", prompt, greedy, logprobs=ask)])["greedy"]
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32
    ).eval()
    return reference, prompt, items


def _generated(items: list) -> tuple[list[int], list]:
    tokens, entries = [], []
    for item in items:
        if isinstance(item, ChoiceDelta):
            tokens += item.token_ids
            entries += item.logprobs
    return tokens, entries


def _exact(reference: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    """float64 log_softmax of transformers' logits over `tokens` (row r predicts r + 1)."""
    with torch.no_grad():
        logits = reference(torch.tensor([tokens])).logits[0]
    return logits.double().log_softmax(dim=-1)


def test_greedy_continuation_of_64_tokens_equals_transformers_greedy(served) -> None:
    """transformers' greedy choice re-reads the whole sequence for each token, as the logits
    this module compares against do. (Its `generate` was seen to choose otherwise than its own
    full forward on the Qwen3-MoE prompt, at a token whose top two logits differ by 7e-3:
    rounding that flips one expert choice moves logits that far.)"""
    reference, prompt, items = served
    tokens, _ = _generated(items)
    expected = list(prompt)
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = reference(torch.tensor([expected])).logits[0, -1]
            expected.append(int(logits.argmax()))

    assert len(tokens) == NEW_TOKENS
    assert len(set(tokens)) >= 5
    assert tokens == expected[len(prompt) :]


def test_generation_logprobs_equal_float64_log_softmax_of_transformers_logits(served) -> None:
    reference, prompt, items = served
    tokens, entries = _generated(items)
    exact = _exact(reference, [*prompt, *tokens])

    assert len(entries) == NEW_TOKENS
    for offset, entry in enumerate(entries):
        row = exact[len(prompt) - 1 + offset]
        chosen = entry.position.chosen
        assert chosen.token_id == tokens[offset]
        assert chosen.logprob == pytest.approx(row[chosen.token_id].item(), abs=ATOL)
        best = torch.argsort(row, descending=True, stable=True)[:5].tolist()
        assert [a.token_id for a in entry.position.alternatives] == best
        for alternative in entry.position.alternatives:
            assert alternative.logprob == pytest.approx(row[alternative.token_id].item(), abs=ATOL)


def test_prompt_scores_equal_float64_log_softmax_of_transformers_logits(served) -> None:
    reference, prompt, items = served
    exact = _exact(reference, list(prompt))
    scores = [
        (item.first_position + i, score)
        for item in items
        if isinstance(item, PromptScores)
        for i, score in enumerate(item.scores)
    ]

    assert [position for position, _ in scores] == list(range(1, len(prompt)))
    for position, score in scores:
        row = exact[position - 1]
        assert score.token_id == prompt[position]
        assert score.logprob == pytest.approx(row[prompt[position]].item(), abs=ATOL)
        assert score.rank == 1 + int((row > row[prompt[position]]).sum())
        for alternative in score.alternatives:
            assert alternative.logprob == pytest.approx(row[alternative.token_id].item(), abs=ATOL)
