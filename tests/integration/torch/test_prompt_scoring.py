"""Prompt scoring: log_softmax-exact scores, exact ranks and the generation ordering."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest
import torch
import transformers

from adapters.gpu.logprobs.normalizer import combine_tiles, tile_statistics
from adapters.gpu.scoring.prompt_scorer import PROJECTION_ROWS, PromptScorer
from domain.logprobs.prompt_scores import (
    INVALID_BITS,
    PROMPT_ROW_WORDS,
    prompt_targets,
    unpack_prompt_row,
)
from domain.logprobs.values import NATURAL_TOP_K, NO_TOKEN, bits_to_float
from tests.support.tiny_models import build_tiny_llama

# Three vocabulary tiles (the last one short), so the tiled normalization is really combined.
VOCAB_SIZE = 2500
PROMPT_LENGTH = 150
CHUNKS = ((0, 100), (100, 50))  # the first spans a full and a partial 64-row block
ATOL = 1e-4
SENTINEL = 0x5A5A5A5A


class Scored:
    """One tiny Llama's prompt, its float32 hidden rows and logits, and helpers to score them."""

    def __init__(self, model: torch.nn.Module, prompt: list[int]) -> None:
        self.model = model
        self.prompt = prompt
        with torch.no_grad():
            ids = torch.tensor([prompt])
            self.hidden = model.model(ids).last_hidden_state[0]
            self.logits = model(ids).logits[0].float()
        self.calls: list[int] = []

    def project(self, rows: torch.Tensor) -> torch.Tensor:
        self.calls.append(rows.shape[0])
        with torch.no_grad():
            return self.model.lm_head(rows).float()

    def score_chunk(self, start: int, length: int) -> torch.Tensor:
        targets = torch.tensor(prompt_targets(self.prompt, start, length), dtype=torch.int32)
        out = torch.full((length, PROMPT_ROW_WORDS), SENTINEL, dtype=torch.int32)
        PromptScorer(VOCAB_SIZE).score(
            self.hidden[start : start + length], targets, self.project, out
        )
        return out


@pytest.fixture(scope="module")
def scored(tmp_path_factory: pytest.TempPathFactory) -> Scored:
    directory = build_tiny_llama(tmp_path_factory.mktemp("llama"), vocab_size=VOCAB_SIZE, seed=5)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    generator = random.Random(11)
    prompt = [generator.randrange(VOCAB_SIZE) for _ in range(PROMPT_LENGTH)]
    return Scored(model.eval(), prompt)


@pytest.fixture(scope="module")
def rows(scored: Scored) -> torch.Tensor:
    return torch.cat([scored.score_chunk(start, length) for start, length in CHUNKS])


def reported(logits: torch.Tensor) -> torch.Tensor:
    """FP32 logit - lse by the shared tiled normalization, as the scorer reports values."""
    return logits - combine_tiles(*tile_statistics(logits))[:, None]


def top_twenty(values: torch.Tensor) -> list[tuple[int, int]]:
    """(ID, bits) of the best twenty lanes by value descending, then ID ascending."""
    row = values.tolist()
    order = sorted(range(len(row)), key=lambda lane: (-(row[lane] + 0.0), lane))
    bits = values.view(torch.int32).tolist()
    return [(lane, bits[lane]) for lane in order[:NATURAL_TOP_K]]


@pytest.mark.model
def test_scores_equal_float64_log_softmax_of_transformers_logits(
    scored: Scored, rows: torch.Tensor
) -> None:
    exact = torch.log_softmax(scored.logits.double(), dim=1)
    for position in range(PROMPT_LENGTH - 1):
        score = unpack_prompt_row(rows[position].tolist())
        assert score is not None
        assert score.token_id == scored.prompt[position + 1]
        assert score.logprob == pytest.approx(exact[position, score.token_id].item(), abs=ATOL)
        for alternative in score.alternatives:
            expected = exact[position, alternative.token_id].item()
            assert alternative.logprob == pytest.approx(expected, abs=ATOL)


@pytest.mark.model
def test_logprob_bits_and_ranks_are_exact_on_the_reported_fp32_values(
    scored: Scored, rows: torch.Tensor
) -> None:
    values = reported(scored.logits)
    for position in range(PROMPT_LENGTH - 1):
        target = scored.prompt[position + 1]
        actual = values[position, target]
        greater = int((values[position].double() > actual.double()).sum())
        assert rows[position, 1].item() == actual.view(torch.int32).item()
        assert rows[position, 2].item() == 1 + greater


@pytest.mark.model
def test_alternatives_are_the_best_twenty_by_value_then_id(
    scored: Scored, rows: torch.Tensor
) -> None:
    values = reported(scored.logits)
    for position in range(PROMPT_LENGTH - 1):
        pairs = rows[position, 3:].view(NATURAL_TOP_K, 2).tolist()
        assert [tuple(pair) for pair in pairs] == top_twenty(values[position])


@pytest.mark.model
def test_the_prompt_end_row_is_invalid(rows: torch.Tensor) -> None:
    last = rows[PROMPT_LENGTH - 1].tolist()
    assert last == [NO_TOKEN, INVALID_BITS, 0] + [NO_TOKEN, 0] * NATURAL_TOP_K
    assert unpack_prompt_row(last) is None


@pytest.mark.model
def test_project_never_sees_more_than_64_rows(scored: Scored) -> None:
    assert PROJECTION_ROWS == 64
    scored.calls.clear()
    scored.score_chunk(0, PROMPT_LENGTH)
    assert scored.calls == [PROJECTION_ROWS, PROJECTION_ROWS, PROMPT_LENGTH - 2 * PROJECTION_ROWS]


def score_logits(logits: torch.Tensor, targets: list[int], vocab_size: int) -> torch.Tensor:
    """Scores given logit rows directly: the hidden rows are the logits and project is identity."""
    out = torch.full((len(targets) + 2, PROMPT_ROW_WORDS), SENTINEL, dtype=torch.int32)
    project: Callable[[torch.Tensor], torch.Tensor] = lambda rows: rows.clone()  # noqa: E731
    target_ids = torch.tensor(targets, dtype=torch.int32)
    PromptScorer(vocab_size).score(logits, target_ids, project, out)
    return out


def test_equal_values_are_not_counted_as_greater() -> None:
    logits = torch.zeros(1, 64)
    logits[0, [3, 9, 40]] = 2.0  # the target ties two other lanes
    logits[0, [5, 6]] = 3.0
    row = score_logits(logits, [9], 64)[0].tolist()
    assert row[2] == 3
    # The cut falls inside the 59 zeros, where only the sort key's ID order decides.
    zeros = [lane for lane in range(64) if lane not in (3, 5, 6, 9, 40)]
    assert row[3::2] == [5, 6, 3, 9, 40] + zeros[:15]


def test_ties_made_by_subtracting_the_normalizer_are_not_counted_as_greater() -> None:
    logits = torch.zeros(1, 2048)
    logits[0, 10] = 1e-6  # the target
    logits[0, 20] = 1.1e-6  # greater as a logit, equal once lse (about 7.6) is subtracted
    values = reported(logits)
    assert values[0, 20] == values[0, 10], "the tie this test needs did not form"
    row = score_logits(logits, [10], 2048)[0].tolist()
    assert row[2] == 1
    assert row[3::2][:2] == [10, 20]


def test_padded_lanes_are_never_counted_or_reported() -> None:
    generator = torch.Generator().manual_seed(3)
    real = torch.randn(70, 1100, generator=generator)
    padded = torch.cat([real, torch.full((70, 60), 50.0)], dim=1)
    targets = [int(lane) for lane in torch.randint(0, 1100, (70,), generator=generator)]
    assert torch.equal(score_logits(padded, targets, 1100), score_logits(real, targets, 1100))
    row = score_logits(padded, targets, 1100)[0]
    assert int(row[3::2].max()) < 1100
    assert row[2].item() <= 1100


def test_a_tiny_vocabulary_pads_alternatives_and_rows_past_the_chunk_stay_unwritten() -> None:
    logits = torch.tensor([[0.5, -1.0, 2.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0, 1.0]])
    out = score_logits(logits, [4, NO_TOKEN], 5)
    first = unpack_prompt_row(out[0].tolist())
    assert first is not None and first.rank == 2
    assert [alternative.token_id for alternative in first.alternatives] == [2, 4, 0, 3, 1]
    assert out[0, 13:].tolist() == [NO_TOKEN, 0] * (NATURAL_TOP_K - 5)
    assert unpack_prompt_row(out[1].tolist()) is None
    assert out[2:].eq(SENTINEL).all()
    expected = torch.log_softmax(logits[0].double(), dim=0)[4].item()
    assert math.isclose(first.logprob, expected, abs_tol=ATOL)


def test_malformed_inputs_are_rejected() -> None:
    scorer = PromptScorer(8)
    out = torch.zeros(2, PROMPT_ROW_WORDS, dtype=torch.int32)
    with pytest.raises(ValueError, match="targets"):
        scorer.score(torch.zeros(2, 8), torch.zeros(2, dtype=torch.int64), torch.clone, out)
    with pytest.raises(ValueError, match="out holds"):
        scorer.score(torch.zeros(3, 8), torch.zeros(3, dtype=torch.int32), torch.clone, out)
    with pytest.raises(ValueError, match="project returned"):
        scorer.score(torch.zeros(2, 4), torch.zeros(2, dtype=torch.int32), torch.clone, out)
    with pytest.raises(ValueError, match="vocab_size"):
        PromptScorer(0)
    assert bits_to_float(INVALID_BITS) != bits_to_float(INVALID_BITS)  # NaN
