"""Philox4x32-10 against Random123's known answers, and the properties the sampler relies on."""

from __future__ import annotations

import pytest
import torch

from adapters.gpu.sampling.philox import philox4x32_10, philox_uniform, uniform_from_bits

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

# Random123 tests/kat_vectors, the three "philox4x32 10" lines: counter, key, expected output.
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    (
        (0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF),
        (0xFFFFFFFF, 0xFFFFFFFF),
        (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD),
    ),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("counter", "key", "expected"), KNOWN_ANSWERS)
def test_philox_matches_the_random123_known_answer_vectors(device, counter, key, expected):
    words = philox4x32_10(
        [torch.tensor(w, device=device) for w in counter],
        [torch.tensor(w, device=device) for w in key],
    )
    assert tuple(int(w) for w in words) == expected


def test_philox_computes_each_element_of_a_broadcast_batch_independently():
    counters = torch.tensor([[0], [0xFFFFFFFF], [0x243F6A88]])
    keys = torch.tensor([0, 0xFFFFFFFF, 0xA4093822, 7])
    batched = torch.stack(philox4x32_10((counters, counters, counters, counters), (keys, keys)))
    assert batched.shape == (4, 3, 4)
    for row, counter in enumerate(counters.flatten().tolist()):
        for column, key in enumerate(keys.tolist()):
            single = philox4x32_10((counter,) * 4, (key, key))
            assert [int(w) for w in single] == batched[:, row, column].tolist()


def test_philox_rejects_a_counter_of_the_wrong_width():
    with pytest.raises(ValueError):
        philox4x32_10((0, 0, 0), (0, 0))


@pytest.mark.parametrize("device", DEVICES)
def test_same_seed_and_counter_always_give_the_same_noise(device):
    seeds = torch.tensor([42, -3, 2**40 + 5], device=device)
    counters = torch.tensor([0, 17, 2**33], device=device)
    first = philox_uniform(seeds, counters, 37)
    again = philox_uniform(seeds.clone(), counters.clone(), 37)
    assert torch.equal(first, again)


def test_different_counters_give_different_noise():
    seeds = torch.full((4,), 1234)
    counters = torch.tensor([0, 1, 2**32, 2**32 + 1])
    noise = philox_uniform(seeds, counters, 64)
    for a in range(4):
        for b in range(a + 1, 4):
            assert not torch.equal(noise[a], noise[b])


def test_seeds_differing_only_in_their_high_word_give_different_noise():
    seeds = torch.tensor([5, 5 + 2**32, -5, 5 - 2**63])
    noise = philox_uniform(seeds, torch.zeros(4, dtype=torch.int64), 64)
    for a in range(4):
        for b in range(a + 1, 4):
            assert not torch.equal(noise[a], noise[b])


def test_noise_of_a_row_does_not_depend_on_the_other_rows_or_its_position():
    alone = philox_uniform(torch.tensor([99]), torch.tensor([7]), 50)
    batch = philox_uniform(torch.tensor([1, 2, 99, 4]), torch.tensor([7, 7, 7, 8]), 50)
    assert torch.equal(alone[0], batch[2])


def test_a_narrower_width_is_a_prefix_of_a_wider_one():
    seeds, counters = torch.tensor([3, 4]), torch.tensor([10, 11])
    wide = philox_uniform(seeds, counters, 12)
    assert torch.equal(philox_uniform(seeds, counters, 5), wide[:, :5])


def test_uniform_floats_never_reach_zero_or_one_even_for_extreme_words():
    extremes = uniform_from_bits(torch.tensor([0, 1, 0xFFFFFFFE, 0xFFFFFFFF]))
    assert extremes.dtype == torch.float32
    assert bool((extremes > 0).all()) and bool((extremes < 1).all())


def test_uniform_noise_is_evenly_spread_over_ten_bins():
    noise = philox_uniform(torch.arange(64), torch.zeros(64, dtype=torch.int64), 1000).flatten()
    counts = torch.histc(noise, bins=10, min=0.0, max=1.0)
    expected = noise.numel() / 10
    assert bool(((counts - expected).abs() < 0.05 * expected).all()), counts
    assert abs(float(noise.mean()) - 0.5) < 0.01


def test_philox_uniform_rejects_mismatched_seeds_and_counters():
    with pytest.raises(ValueError):
        philox_uniform(torch.tensor([1, 2]), torch.tensor([1]), 4)
    with pytest.raises(TypeError):
        philox_uniform(torch.tensor([1], dtype=torch.int32), torch.tensor([1]), 4)
