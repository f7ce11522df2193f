"""`Sampler.verify`: history drafts accepted with p(d), rejections drawn from p without d.

A verified row must emit exactly what plain sampling would in distribution, whatever the draft:
P(d) = p(d) * 1 and P(t != d) = (1 - p(d)) * p(t) / (1 - p(d)) = p(t).
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chi2

from adapters.gpu.sampling.sampler import Sampler
from tests.integration.torch.test_sampler import build, logits_of

VERIFY = Sampler().verify
SAMPLE = Sampler().sample
PROBS = [0.05, 0.15, 0.3, 0.5]
SIGNIFICANCE = 1e-4


def emitted(keeps: torch.Tensor, chosen: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    return torch.where(keeps, drafts, chosen)


@pytest.mark.parametrize("draft", [0, 2, 3])
def test_a_verified_row_emits_tokens_with_the_target_distribution(draft):
    rows = 20_000
    tensors = build(rows, 4, temperature=1.0, seeds=range(rows), counters=11)
    drafts = torch.full((rows,), draft, dtype=torch.int64)

    keeps, chosen = VERIFY(logits_of(PROBS, rows), tensors, drafts)

    counts = torch.bincount(emitted(keeps, chosen, drafts), minlength=4).double()
    expected = torch.tensor(PROBS, dtype=torch.float64) * rows
    statistic = float(((counts - expected) ** 2 / expected).sum())
    assert statistic < chi2.isf(SIGNIFICANCE, df=3), counts.tolist()
    # The draft stands about p(d) of the time, and a rejected row never emits it.
    assert abs(keeps.double().mean().item() - PROBS[draft]) < 0.02
    assert not bool(((~keeps) & (chosen == draft)).any())


def test_a_row_without_a_draft_draws_exactly_what_plain_sampling_draws():
    rows = 64
    tensors = build(rows, 4, temperature=0.8, top_k=3, seeds=range(rows), counters=5)
    logits = logits_of(PROBS, rows)
    none = torch.full((rows,), -1, dtype=torch.int64)

    keeps, chosen = VERIFY(logits, tensors, none)

    assert not bool(keeps.any())
    assert torch.equal(chosen, SAMPLE(logits, tensors))


def test_greedy_rows_keep_a_draft_equal_to_the_argmax_and_correct_the_others():
    tensors = build(3, 4, temperature=0.0)
    drafts = torch.tensor([3, 1, -1])

    keeps, chosen = VERIFY(logits_of(PROBS, 3), tensors, drafts)

    assert keeps.tolist() == [True, False, False]
    assert chosen.tolist() == [3, 3, 3]


def test_a_draft_the_filters_remove_is_always_rejected():
    rows = 2000
    tensors = build(rows, 4, temperature=1.0, top_k=2, seeds=range(rows))
    drafts = torch.zeros(rows, dtype=torch.int64)  # token 0 is outside the top 2

    keeps, chosen = VERIFY(logits_of(PROBS, rows), tensors, drafts)

    assert not bool(keeps.any())
    assert set(chosen.tolist()) <= {2, 3}


def test_verification_is_keyed_by_seed_and_position_not_by_the_batch():
    tensors = build(4, 4, temperature=1.0, seeds=[5, 6, 7, 8], counters=[1, 2, 3, 4])
    drafts = torch.tensor([3, 2, 1, -1])
    keeps, chosen = VERIFY(logits_of(PROBS, 4), tensors, drafts)

    alone = build(1, 4, temperature=1.0, seeds=[7], counters=[3])
    keep, choice = VERIFY(logits_of(PROBS, 1), alone, torch.tensor([1]))

    assert (keep.item(), choice.item()) == (keeps[2].item(), chosen[2].item())


def test_verification_leaves_the_raw_logits_untouched():
    logits = logits_of(PROBS, 8)
    before = logits.clone()
    tensors = build(
        8, 4, temperature=0.7, top_p=0.8, seeds=range(8), presence=0.5, generated=[[1]] * 8
    )

    VERIFY(logits, tensors, torch.tensor([0, 1, 2, 3, -1, 0, 1, 2]))

    assert torch.equal(logits, before)


DRAFT_PROBS = [0.4, 0.3, 0.2, 0.1]


def test_draft_model_proposals_verified_with_p_over_q_keep_the_target_distribution():
    rows = 20_000
    draft_tensors = build(rows, 4, temperature=1.0, seeds=range(rows), counters=7)
    drafts, q = Sampler().draw(logits_of(DRAFT_PROBS, rows), draft_tensors)
    target_tensors = build(rows, 4, temperature=1.0, seeds=range(rows), counters=7)

    keeps, chosen = VERIFY(logits_of(PROBS, rows), target_tensors, drafts, q)

    # The drafts themselves follow q, and what the rows emit follows p.
    proposed = torch.bincount(drafts, minlength=4).double()
    assert abs(proposed[0].item() / rows - DRAFT_PROBS[0]) < 0.02
    counts = torch.bincount(emitted(keeps, chosen, drafts), minlength=4).double()
    expected = torch.tensor(PROBS, dtype=torch.float64) * rows
    statistic = float(((counts - expected) ** 2 / expected).sum())
    assert statistic < chi2.isf(SIGNIFICANCE, df=3), counts.tolist()
    # Acceptance is sum over d of q(d) min(1, p(d)/q(d)) = sum of min(p, q).
    overlap = sum(min(p, q_) for p, q_ in zip(PROBS, DRAFT_PROBS, strict=True))
    assert abs(keeps.double().mean().item() - overlap) < 0.02


def test_a_greedy_draft_row_is_one_hot_and_drawn_from_its_own_stream():
    tensors = build(3, 4, temperature=[0.0, 1.0, 1.0], seeds=[1, 2, 2], counters=[5, 5, 5])

    tokens, q = Sampler().draw(logits_of(DRAFT_PROBS, 3), tensors)

    assert tokens[0].item() == 0 and q[0].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert torch.allclose(q[1], torch.tensor(DRAFT_PROBS), atol=1e-6)
    assert tokens[1].item() == tokens[2].item()
    # Same seed and position, other stream: drafts never reuse the target's noise.
    draws = build(2000, 4, temperature=1.0, seeds=range(2000), counters=5)
    assert not torch.equal(
        Sampler().draw(logits_of(DRAFT_PROBS, 2000), draws)[0],
        SAMPLE(logits_of(DRAFT_PROBS, 2000), draws),
    )
