"""Sampler: logit edits, penalties, temperature, filters and seeded, batch-invariant draws."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
import torch

from adapters.gpu.sampling.sampler import Sampler, SamplingTensors, edited_logits, filtered_logits

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _per_row(value: float | Sequence[float], rows: int) -> list:
    return list(value) if isinstance(value, Sequence) else [value] * rows


def build(
    rows: int,
    vocab: int,
    *,
    device: str = "cpu",
    temperature: float | Sequence[float] = 0.0,
    top_k: int | Sequence[int] = 0,
    top_p: float | Sequence[float] = 1.0,
    min_p: float | Sequence[float] = 0.0,
    presence: float | Sequence[float] = 0.0,
    frequency: float | Sequence[float] = 0.0,
    repetition: float | Sequence[float] = 1.0,
    generated: Sequence[Sequence[int]] | None = None,
    prompt: Sequence[Sequence[int]] | None = None,
    bias: Sequence[tuple[int, int, float]] = (),
    banned: Sequence[tuple[int, int]] = (),
    seeds: Sequence[int] | None = None,
    counters: int | Sequence[int] = 0,
) -> SamplingTensors:
    """What the model runner would build for these per-row parameters (scalars fill every row)."""

    def floats(value):
        return torch.tensor(_per_row(value, rows), dtype=torch.float32, device=device)

    temperatures = _per_row(temperature, rows)
    top_ks, top_ps, min_ps = _per_row(top_k, rows), _per_row(top_p, rows), _per_row(min_p, rows)
    presences, frequencies = _per_row(presence, rows), _per_row(frequency, rows)
    repetitions = _per_row(repetition, rows)
    any_repetition = any(r != 1.0 for r in repetitions)
    any_penalties = any_repetition or any(p != 0 for p in presences + frequencies)
    output_counts = prompt_mask = None
    if any_penalties:
        output_counts = torch.zeros(rows, vocab, dtype=torch.int32, device=device)
        for row, tokens in enumerate(generated or []):
            for token_id in tokens:
                output_counts[row, token_id] += 1
    if any_repetition:
        prompt_mask = torch.zeros(rows, vocab, dtype=torch.bool, device=device)
        for row, tokens in enumerate(prompt or []):
            prompt_mask[row, list(tokens)] = True

    def longs(values):
        return torch.tensor(list(values), dtype=torch.int64, device=device)

    return SamplingTensors(
        temperature=floats(temperatures),
        top_k=torch.tensor(top_ks, dtype=torch.int32, device=device),
        top_p=floats(top_ps),
        min_p=floats(min_ps),
        presence_penalty=floats(presences),
        frequency_penalty=floats(frequencies),
        repetition_penalty=floats(repetitions),
        output_counts=output_counts,
        prompt_mask=prompt_mask,
        bias_rows=longs(b[0] for b in bias),
        bias_token_ids=longs(b[1] for b in bias),
        bias_values=torch.tensor([b[2] for b in bias], dtype=torch.float32, device=device),
        banned_rows=longs(b[0] for b in banned),
        banned_token_ids=longs(b[1] for b in banned),
        seeds=longs(seeds if seeds is not None else range(rows)),
        counters=longs(_per_row(counters, rows)),
        all_greedy=all(t == 0 for t in temperatures),
        any_penalties=any_penalties,
        any_top_k_top_p=any(0 < k < vocab for k in top_ks) or any(p < 1 for p in top_ps),
        any_min_p=any(p > 0 for p in min_ps),
    )


def logits_of(probs: Sequence[float], rows: int = 1) -> torch.Tensor:
    return torch.tensor([list(probs)] * rows).log()


SAMPLE = Sampler().sample


# --- raw logits stay untouched ---------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_raw_logits_are_unchanged_after_sampling_with_every_feature_on(device, temperature):
    logits = torch.randn(3, 20, generator=torch.Generator().manual_seed(0)).to(device)
    before = logits.clone()
    tensors = build(
        3,
        20,
        device=device,
        temperature=temperature,
        top_k=5,
        top_p=0.8,
        min_p=0.05,
        presence=0.5,
        frequency=0.3,
        repetition=1.3,
        generated=[[1, 1], [2], []],
        prompt=[[3], [4, 5], [6]],
        bias=[(0, 7, 2.0)],
        banned=[(1, 8)],
    )
    SAMPLE(logits, tensors)
    assert torch.equal(logits, before)


def test_greedy_batch_without_edits_returns_argmax_and_leaves_the_logits_alone():
    logits = torch.tensor([[0.0, 3.0, 1.0], [5.0, -1.0, 2.0]])
    before = logits.clone()
    assert SAMPLE(logits, build(2, 3)).tolist() == [1, 0]
    assert torch.equal(logits, before)


# --- greedy, bias, bans ----------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_picks_the_argmax_and_ties_go_to_the_lowest_token_id(device):
    logits = torch.tensor(
        [[1.0, 4.0, 4.0, 2.0], [7.0, 7.0, 7.0, 7.0], [-1.0, -3.0, -0.5, -0.5]], device=device
    )
    chosen = SAMPLE(logits, build(3, 4, device=device))
    assert chosen.dtype == torch.int64
    assert chosen.tolist() == [1, 0, 2]


def test_logit_bias_is_added_and_changes_the_greedy_choice():
    logits = torch.tensor([[3.0, 2.0, 1.0], [3.0, 2.0, 1.0]])
    tensors = build(2, 3, bias=[(0, 2, 2.5), (1, 0, -5.0)])
    assert SAMPLE(logits, tensors).tolist() == [2, 1]
    assert edited_logits(logits, tensors).tolist() == [[3.0, 2.0, 3.5], [-2.0, 2.0, 1.0]]


def test_banned_token_is_never_chosen_even_when_it_is_the_top_logit():
    logits = torch.tensor([[9.0, 1.0, 0.5, 0.0]] * 200)
    banned = [(row, 0) for row in range(200)] + [(row, 1) for row in range(0, 200, 2)]
    greedy = SAMPLE(logits, build(200, 4, banned=banned))
    assert greedy[0::2].eq(2).all() and greedy[1::2].eq(1).all()
    sampled = SAMPLE(logits, build(200, 4, temperature=1.0, banned=banned))
    assert not sampled.eq(0).any() and not sampled[0::2].eq(1).any()
    assert sampled.unique().numel() > 1


# --- penalties -------------------------------------------------------------------------------


def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0]])
    tensors = build(1, 5, repetition=2.0, prompt=[[0]], generated=[[1, 1, 2]])
    # Tokens 0 (prompt), 1 and 2 (generated) are seen; 3 and 4 are not.
    assert edited_logits(logits, tensors).tolist() == [[1.0, -2.0, 0.25, 3.0, -2.0]]


def test_frequency_penalty_subtracts_penalty_times_generated_count():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    tensors = build(1, 4, frequency=0.5, prompt=[[3]], generated=[[1, 1, 1, 2]])
    assert edited_logits(logits, tensors).tolist() == [[2.0, -2.5, 0.0, 3.0]]


def test_presence_penalty_subtracts_once_per_generated_token_and_ignores_the_prompt():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    tensors = build(1, 4, presence=0.75, prompt=[[3]], generated=[[1, 1, 1, 2]])
    assert edited_logits(logits, tensors).tolist() == [[2.0, -1.75, -0.25, 3.0]]


def test_bias_then_repetition_then_frequency_then_presence_apply_in_that_order():
    logits = torch.tensor([[1.0, -1.0, 4.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    tensors = build(
        2,
        4,
        repetition=[2.0, 1.0],
        frequency=[0.5, 0.0],
        presence=[1.0, 0.0],
        prompt=[[0], []],
        generated=[[2, 2], [0]],
        bias=[(0, 1, 3.0)],
    )
    # Row 0: token 1 becomes 2.0 by bias (unseen); token 0 is 1/2; token 2 is 4/2 - 2*0.5 - 1.
    # Row 1 uses no penalty even though it generated token 0.
    assert edited_logits(logits, tensors).tolist() == [[0.5, 2.0, 0.0, 0.0], [1.0] * 4]


def test_penalties_change_the_greedy_choice():
    logits = torch.tensor([[5.0, 4.0, 1.0]] * 3)
    tensors = build(
        3,
        3,
        repetition=[2.0, 1.0, 1.0],
        frequency=[0.0, 0.6, 0.0],
        presence=[0.0, 0.0, 1.5],
        prompt=[[0], [], []],
        generated=[[], [0, 0], [0]],
    )
    assert SAMPLE(logits, tensors).tolist() == [1, 1, 1]


# --- temperature and distribution ------------------------------------------------------------


def test_tiny_temperature_always_samples_the_most_likely_token():
    logits = logits_of([0.3, 0.34, 0.36], rows=300)
    chosen = SAMPLE(logits, build(300, 3, temperature=1e-3))
    assert chosen.eq(2).all()


def test_temperature_below_the_greedy_threshold_is_sampled_greedily_without_overflow():
    logits = torch.tensor([[1e30, 9e29, 0.0]] * 50)
    assert SAMPLE(logits, build(50, 3, temperature=1e-9)).eq(0).all()


@pytest.mark.parametrize("vary", ["seeds", "counters"])
def test_temperature_one_follows_the_softmax_distribution_over_many_draws(vary):
    rows, probs = 8000, [0.1, 0.2, 0.3, 0.4]
    seeds = list(range(rows)) if vary == "seeds" else [77] * rows
    counters = 5 if vary == "seeds" else list(range(rows))
    tensors = build(rows, 4, temperature=1.0, seeds=seeds, counters=counters)
    counts = torch.bincount(SAMPLE(logits_of(probs, rows), tensors), minlength=4).double()
    expected = torch.tensor(probs, dtype=torch.float64) * rows
    chi_square = float(((counts - expected) ** 2 / expected).sum())
    # Three degrees of freedom: 16.3 is the 0.1% tail; 30 is a loose, still meaningful bound.
    assert chi_square < 30.0, counts.tolist()


def test_temperature_flattens_or_sharpens_the_distribution():
    rows = 4000
    logits = logits_of([0.2, 0.8], rows)
    hot = SAMPLE(logits, build(rows, 2, temperature=4.0)).eq(1).double().mean()
    cold = SAMPLE(logits, build(rows, 2, temperature=0.5)).eq(1).double().mean()
    # softmax(log p / T): 0.8 becomes 4**0.25 / (1 + 4**0.25) = 0.586 hot, 16/17 = 0.941 cold.
    assert abs(float(hot) - 0.586) < 0.03 and abs(float(cold) - 0.941) < 0.02


# --- filters ---------------------------------------------------------------------------------


def _kept(logits: torch.Tensor, tensors: SamplingTensors) -> list[list[int]]:
    filtered = filtered_logits(logits, tensors)
    return [torch.nonzero(row > -math.inf).flatten().tolist() for row in filtered]


def test_filters_keep_exactly_the_expected_tokens_with_per_row_parameters():
    logits = logits_of([0.05, 0.5, 0.15, 0.3], rows=7)
    tensors = build(
        7,
        4,
        temperature=1.0,
        top_k=[1, 2, 0, 0, 0, 0, 9],
        top_p=[1.0, 1.0, 0.78, 0.82, 1.0, 1.0, 0.5],
        min_p=[0.0, 0.0, 0.0, 0.0, 0.2, 0.61, 0.0],
    )
    assert _kept(logits, tensors) == [[1], [1, 3], [1, 3], [1, 2, 3], [1, 2, 3], [1], [1]]


def test_top_p_applies_to_what_top_k_leaves_renormalised():
    logits = logits_of([0.05, 0.5, 0.15, 0.3])
    # After top_k=3 the masses are 0.5/0.95, 0.3/0.95: 0.526 + 0.316 < 0.85, so three are kept.
    assert _kept(logits, build(1, 4, temperature=1.0, top_k=3, top_p=0.85)) == [[1, 2, 3]]
    assert _kept(logits, build(1, 4, temperature=1.0, top_k=3, top_p=0.84)) == [[1, 3]]


def test_top_k_keeps_every_token_tied_at_the_cutoff():
    logits = torch.tensor([[1.0, 3.0, 2.0, 2.0, 0.0]])
    assert _kept(logits, build(1, 5, temperature=1.0, top_k=2)) == [[1, 2, 3]]


def test_top_p_filters_after_temperature_reshapes_the_distribution():
    logits = logits_of([0.5, 0.3, 0.2])
    assert _kept(logits, build(1, 3, temperature=1.0, top_p=0.6)) == [[0, 1]]
    # At T=0.25 the top token alone holds 0.5**4 / (0.5**4 + 0.3**4 + 0.2**4) = 0.87 > 0.6.
    assert _kept(logits, build(1, 3, temperature=0.25, top_p=0.6)) == [[0]]


def test_filtered_logits_leave_the_input_untouched():
    logits = logits_of([0.05, 0.5, 0.15, 0.3])
    before = logits.clone()
    filtered_logits(logits, build(1, 4, temperature=0.5, top_k=2, top_p=0.5, min_p=0.5))
    assert torch.equal(logits, before)


@pytest.mark.parametrize(
    ("parameters", "allowed"),
    [
        ({"top_k": 3}, {4, 5, 6}),
        ({"top_p": 0.6}, {4, 5, 6}),
        ({"min_p": 0.62}, {5, 6}),
    ],
)
def test_sampling_never_returns_a_filtered_token(parameters, allowed):
    rows = 3000
    probs = [0.02, 0.03, 0.05, 0.1, 0.18, 0.22, 0.4]
    tensors = build(rows, 7, temperature=1.5, **parameters)
    chosen = set(SAMPLE(logits_of(probs, rows), tensors).tolist())
    assert chosen == allowed


# --- seeding and batch invariance ------------------------------------------------------------


def _seeded_row_alone_and_in_batches(device: str, seed: int) -> list[int]:
    vocab = 300
    generator = torch.Generator().manual_seed(3)
    target = torch.randn(vocab, generator=generator)
    others = torch.randn(4, vocab, generator=generator)
    mine = {
        "temperature": 1.3,
        "top_k": 200,
        "top_p": 0.95,
        "min_p": 0.01,
        "presence": 0.4,
        "generated": [5, 9],
        "seed": seed,
        "counter": 11,
    }
    theirs = [
        {
            "temperature": 0.0,
            "top_k": 0,
            "top_p": 1.0,
            "min_p": 0.0,
            "presence": 0.0,
            "generated": [],
            "seed": 1,
            "counter": 0,
        },
        {
            "temperature": 0.5,
            "top_k": 3,
            "top_p": 1.0,
            "min_p": 0.0,
            "presence": 1.0,
            "generated": [1],
            "seed": seed,
            "counter": 12,
        },
        {
            "temperature": 2.0,
            "top_k": 0,
            "top_p": 0.3,
            "min_p": 0.2,
            "presence": 0.0,
            "generated": [],
            "seed": seed + 1,
            "counter": 11,
        },
        {
            "temperature": 1.0,
            "top_k": 10,
            "top_p": 0.9,
            "min_p": 0.0,
            "presence": 0.0,
            "generated": [7],
            "seed": 99,
            "counter": 3,
        },
    ]
    results = []
    for index in (None, 0, 2, 4):
        rows = [mine] if index is None else theirs[:index] + [mine] + theirs[index:]
        logits = torch.stack(
            [target] if index is None else [*others[:index], target, *others[index:]]
        ).to(device)
        tensors = build(
            len(rows),
            vocab,
            device=device,
            temperature=[r["temperature"] for r in rows],
            top_k=[r["top_k"] for r in rows],
            top_p=[r["top_p"] for r in rows],
            min_p=[r["min_p"] for r in rows],
            presence=[r["presence"] for r in rows],
            generated=[r["generated"] for r in rows],
            seeds=[r["seed"] for r in rows],
            counters=[r["counter"] for r in rows],
            banned=[(i, 0) for i in range(len(rows))],
        )
        results.append(int(SAMPLE(logits, tensors)[0 if index is None else index]))
    return results


@pytest.mark.parametrize("device", DEVICES)
def test_seeded_row_gives_the_same_token_alone_and_at_any_index_of_a_batch_of_five(device):
    chosen_per_seed = [_seeded_row_alone_and_in_batches(device, seed) for seed in range(8)]
    for chosen in chosen_per_seed:
        assert len(set(chosen)) == 1, chosen
    # Different seeds must draw different tokens, or the check above would prove nothing.
    assert len({chosen[0] for chosen in chosen_per_seed}) > 3


def test_same_seed_and_counter_repeat_the_token_while_new_counters_move_on():
    logits = torch.zeros(1, 1000)
    draws = [
        int(SAMPLE(logits, build(1, 1000, temperature=1.0, seeds=[2024], counters=counter)))
        for counter in (0, 0, 1, 2, 3)
    ]
    assert draws[0] == draws[1]
    assert len(set(draws[1:])) == 4


def test_mixed_batch_takes_argmax_on_greedy_rows_and_samples_the_others():
    rows = 400
    logits = logits_of([0.3, 0.3, 0.4], rows)
    temperatures = [0.0 if row % 2 == 0 else 1.0 for row in range(rows)]
    chosen = SAMPLE(logits, build(rows, 3, temperature=temperatures))
    assert chosen[0::2].eq(2).all()
    assert set(chosen[1::2].tolist()) == {0, 1, 2}


# --- validation ------------------------------------------------------------------------------


def test_sampling_tensors_reject_a_wrong_dtype():
    tensors = build(2, 4)
    with pytest.raises(TypeError):
        SamplingTensors(**{**tensors.__dict__, "top_k": tensors.top_k.long()})


def test_sampling_tensors_reject_rows_of_different_lengths():
    tensors = build(2, 4)
    with pytest.raises(ValueError):
        SamplingTensors(**{**tensors.__dict__, "top_p": torch.ones(3)})
    with pytest.raises(ValueError):
        SamplingTensors(**{**tensors.__dict__, "bias_values": torch.ones(1)})


def test_sampling_tensors_require_output_counts_when_penalties_are_on():
    tensors = build(2, 4)
    with pytest.raises(ValueError):
        SamplingTensors(**{**tensors.__dict__, "any_penalties": True})


def test_sampler_rejects_logits_whose_shape_does_not_match_the_rows():
    with pytest.raises(ValueError):
        SAMPLE(torch.zeros(3, 4), build(2, 4))
