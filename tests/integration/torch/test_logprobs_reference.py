"""Reference logprob reduction: FP32 values, sort-key ordering, gating and the packed frame."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.gpu.logprobs.keys import order_keys
from adapters.gpu.logprobs.reducer import ReductionInputs
from adapters.gpu.logprobs.reference_reducer import ReferenceLogprobReducer
from domain.logprobs.values import (
    FULL_POSITION_WORDS,
    MAX_SELECTED_IDS,
    NATURAL_TOP_K,
    bits_to_float,
    float_to_bits,
    sort_key,
)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
DTYPES = [torch.float32, torch.bfloat16]
SENTINEL = 0x5A5A5A5A
FP32_EPS = 2.0**-23


class Frame:
    """One active completion frame prefilled with a sentinel, plus the per-slot request inputs."""

    def __init__(
        self, capacity: int, tokens: int, *, full: bool, device: str, top_k: int = NATURAL_TOP_K
    ) -> None:
        words = FULL_POSITION_WORDS if full else 2 + 2 * top_k
        self.out = torch.full((capacity, tokens, words), SENTINEL, dtype=torch.int32, device=device)
        self.requested = torch.zeros(capacity, dtype=torch.int32, device=device)
        self.counts = self.token_ids = None
        if full:
            self.counts = torch.zeros(capacity, dtype=torch.int32, device=device)
            # Stale IDs past each uploaded prefix: huge and negative, never valid read indices.
            stale = torch.tensor([10**6, -5], dtype=torch.int32, device=device)
            self.token_ids = stale.repeat(capacity, MAX_SELECTED_IDS // 2)

    def request(self, slot: int, token_ids: list[int] | None = None) -> None:
        self.requested[slot] = 1
        if token_ids:
            self.counts[slot] = len(token_ids)
            self.token_ids[slot, : len(token_ids)] = torch.tensor(token_ids, dtype=torch.int32)

    def reduce(
        self,
        reducer: ReferenceLogprobReducer,
        logits: torch.Tensor,
        rows: list[tuple[int, int, int]],
    ) -> None:
        """rows: (slot, position, chosen) of each logits row."""
        device = logits.device

        def column(i: int) -> torch.Tensor:
            return torch.tensor([row[i] for row in rows], dtype=torch.int64, device=device)

        reducer.reduce(
            ReductionInputs(
                logits,
                column(0),
                column(1),
                column(2),
                self.requested,
                self.counts,
                self.token_ids,
                self.out,
            )
        )

    def chosen(self, slot: int, position: int = 0) -> tuple[int, int]:
        words = self.out[slot, position].tolist()
        return words[0], words[1]

    def pairs(self, slot: int, position: int = 0, count: int = NATURAL_TOP_K) -> list:
        """(ID, FP32 bits) pairs as stored."""
        words = self.out[slot, position].tolist()
        return [(words[2 + 2 * i], words[3 + 2 * i]) for i in range(count)]

    def tail(self, slot: int, position: int, after_pairs: int) -> list[int]:
        return self.out[slot, position, 2 + 2 * after_pairs :].tolist()


def reference_values(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """float64 log_softmax of the FP32 upcast of the real vocabulary."""
    return torch.log_softmax(logits[:, :vocab].float().double().cpu(), dim=1)


def reference_lse(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.logsumexp(logits[:, :vocab].float().double().cpu(), dim=1)


def value(bits: int) -> float:
    return bits_to_float(bits)


def assert_close_to_reference(got_bits: int, expected: float, logit: float, lse: float) -> None:
    """FP32 rounding of the lse, of its sum and of the subtraction: a few ulps of the operands."""
    got = value(got_bits)
    tolerance = 8 * FP32_EPS * (1.0 + abs(logit) + abs(lse))
    assert abs(got - expected) <= tolerance, (got, expected, tolerance)


def padded(logits: torch.Tensor, lanes: int, fill: float) -> torch.Tensor:
    pad = torch.full((logits.shape[0], lanes), fill, dtype=logits.dtype, device=logits.device)
    return torch.cat([logits, pad], dim=1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_reported_values_match_float64_log_softmax_of_the_upcast_logits(dtype, device) -> None:
    vocab, rows = 1000, 6
    generator = torch.Generator().manual_seed(7)
    real = (torch.randn(rows, vocab, generator=generator) * 4).to(dtype).to(device)
    logits = padded(real, 24, 1e30)
    frame = Frame(capacity=4, tokens=3, full=True, device=device)
    frame.request(0)
    frame.request(2, [5, 999, 0, 517])
    frame.request(3)
    chosen = [3, 17, 999, 0, 512, 64]
    layout = [(0, 0), (0, 1), (0, 2), (2, 0), (2, 1), (3, 0)]
    frame.reduce(
        ReferenceLogprobReducer(vocab),
        logits,
        [(s, p, c) for (s, p), c in zip(layout, chosen, strict=True)],
    )

    expected = reference_values(logits, vocab)
    lse = reference_lse(logits, vocab)
    upcast = real.float().cpu()
    for row, ((slot, position), token) in enumerate(zip(layout, chosen, strict=True)):
        token_id, bits = frame.chosen(slot, position)
        assert token_id == token
        assert_close_to_reference(
            bits, expected[row, token].item(), upcast[row, token].item(), lse[row].item()
        )
        selecting = slot == 2
        pairs = frame.pairs(slot, position, 4 if selecting else NATURAL_TOP_K)
        if selecting:
            assert [token_id for token_id, _ in pairs] == [5, 999, 0, 517]
        for token_id, bits in pairs:
            assert_close_to_reference(
                bits, expected[row, token_id].item(), upcast[row, token_id].item(), lse[row].item()
            )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_exact_ties_at_the_cutoff_select_the_smallest_token_ids(dtype, device) -> None:
    vocab = 64
    logits = torch.full((1, vocab), -2.0)
    logits[0, [40, 45, 10]] = torch.tensor([3.0, 2.5, 2.0])
    tied = [63, 2, 50, 7, 33, 11, 48, 0, 21, 36, 59, 5, 17, 29, 44, 13, 52, 26, 38, 9, 61, 24]
    logits[0, tied] = 1.0
    frame = Frame(capacity=1, tokens=1, full=False, device=device)
    frame.request(0)
    frame.reduce(ReferenceLogprobReducer(vocab), logits.to(dtype).to(device), [(0, 0, 40)])

    pairs = frame.pairs(0)
    assert [token_id for token_id, _ in pairs] == [40, 45, 10] + sorted(tied)[:17]
    assert len({bits for _, bits in pairs[3:]}) == 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("top_k", [2, NATURAL_TOP_K])
def test_ties_created_by_the_subtraction_rank_by_token_id_not_by_raw_logit(top_k, device) -> None:
    # Next to lse = 40 one FP32 ulp is about 3.8e-6, so raw logits 0 and 1e-6 both report -40.
    vocab = 8
    logits = torch.full((1, vocab), -math.inf)
    logits[0, 0], logits[0, 3], logits[0, 6] = 40.0, 0.0, 1e-6
    frame = Frame(capacity=1, tokens=1, full=False, device=device, top_k=top_k)
    frame.request(0)
    frame.reduce(ReferenceLogprobReducer(vocab, top_k), logits.to(device), [(0, 0, 6)])

    pairs = dict(frame.pairs(0, count=top_k))
    assert logits[0, 6] > logits[0, 3]
    assert pairs[3] == frame.chosen(0)[1] == float_to_bits(-40.0)
    ids = [token_id for token_id, _ in frame.pairs(0, count=top_k)]
    assert ids == ([0, 3, 6, 1, 2, 4, 5, 7] + [-1] * 12)[:top_k]


@pytest.mark.parametrize("device", DEVICES)
def test_signed_zero_keys_tie_and_then_rank_by_token_id(device) -> None:
    values = torch.tensor([-0.0, 0.0, -0.0, 0.0, -1e-45, 1e-45], device=device)
    ids = torch.tensor([5, 2, 1, 9, 0, 4], device=device)

    keys = order_keys(values, ids)

    assert keys.tolist() == [
        sort_key(v, i) for v, i in zip(values.tolist(), ids.tolist(), strict=True)
    ]
    ranked = ids[torch.argsort(keys, descending=True)].tolist()
    assert ranked == [4, 1, 2, 5, 9, 0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_reported_negative_zero_keeps_its_bits_and_ranks_as_zero(dtype, device) -> None:
    # Both zeros cannot be reported in one row: each would need all the probability mass. A lone
    # -0.0 logit among -inf ones gives lse = +0.0 and the value -0.0 - +0.0 = -0.0.
    logits = torch.full((2, 4), -math.inf)
    logits[0, 1], logits[1, 2] = -0.0, 0.0
    frame = Frame(capacity=2, tokens=1, full=False, device=device)
    frame.request(0)
    frame.request(1)
    frame.reduce(ReferenceLogprobReducer(4), logits.to(dtype).to(device), [(0, 0, 1), (1, 0, 2)])

    negative_zero, minus_inf = float_to_bits(-0.0), float_to_bits(-math.inf)
    assert frame.chosen(0) == (1, negative_zero)
    assert frame.pairs(0, count=4) == [
        (1, negative_zero),
        (0, minus_inf),
        (2, minus_inf),
        (3, minus_inf),
    ]
    assert frame.pairs(1, count=2) == [(2, 0), (0, minus_inf)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("full", [False, True])
def test_a_vocabulary_smaller_than_k_reports_minus_one_ids_after_its_entries(full, device) -> None:
    vocab = 5
    logits = padded(torch.tensor([[0.5, 2.0, -1.0, 2.0, 0.0]], device=device), 3, 1e30)
    frame = Frame(capacity=1, tokens=2, full=full, device=device)
    frame.request(0)
    frame.reduce(ReferenceLogprobReducer(vocab), logits, [(0, 1, 2)])

    pairs = frame.pairs(0, 1)
    assert [token_id for token_id, _ in pairs] == [1, 3, 0, 4, 2] + [-1] * 15
    assert [bits for _, bits in pairs[5:]] == [0] * 15
    assert set(frame.tail(0, 1, NATURAL_TOP_K)) <= {SENTINEL}
    assert set(frame.out[0, 0].tolist()) == {SENTINEL}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_padded_lanes_never_appear_and_never_change_the_normalizer(dtype, device) -> None:
    vocab = 30
    generator = torch.Generator().manual_seed(3)
    real = torch.randn(2, vocab, generator=generator).to(dtype).to(device)
    wide = padded(padded(real, 17, 1e30), 1, math.inf)
    wide[1, -3] = math.nan
    frames = []
    for logits in (real, wide):
        frame = Frame(capacity=2, tokens=1, full=True, device=device)
        frame.request(0)
        frame.request(1, [29, 0, 30, 46])
        frame.reduce(ReferenceLogprobReducer(vocab), logits, [(0, 0, 4), (1, 0, 29)])
        frames.append(frame)

    assert torch.equal(frames[0].out, frames[1].out)
    assert all(0 <= token_id < vocab for token_id, _ in frames[1].pairs(0))
    # Selected IDs in padded lanes are reported as NaN rather than read.
    (_, first), (_, second) = frames[1].pairs(1, count=4)[2:]
    assert math.isnan(value(first)) and math.isnan(value(second))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_minus_infinity_logits_report_minus_infinity_and_rank_last_by_id(dtype, device) -> None:
    vocab = 30
    logits = torch.full((1, vocab), -math.inf)
    logits[0, [29, 15, 4]] = torch.tensor([1.0, 3.0, 2.0])
    frame = Frame(capacity=1, tokens=1, full=False, device=device)
    frame.request(0)
    frame.reduce(ReferenceLogprobReducer(vocab), logits.to(dtype).to(device), [(0, 0, 7)])

    minus_inf = float_to_bits(-math.inf)
    assert frame.chosen(0) == (7, minus_inf)
    pairs = frame.pairs(0)
    infinite = [i for i in range(vocab) if i not in (29, 15, 4)][:17]
    assert [token_id for token_id, _ in pairs] == [15, 4, 29] + infinite
    assert [bits for _, bits in pairs[3:]] == [minus_inf] * 17
    assert all(math.isfinite(value(bits)) for _, bits in pairs[:3])


@pytest.mark.parametrize("device", DEVICES)
def test_lanes_that_do_not_request_are_neither_read_nor_written(device) -> None:
    vocab, capacity, tokens = 50, 6, 3
    generator = torch.Generator().manual_seed(11)
    logits = torch.randn(7, vocab, generator=generator).to(device)
    frame = Frame(capacity, tokens, full=True, device=device)
    for slot in (1, 4):
        frame.request(slot)
    frame.request(2, [7, 3])
    before_logits = logits.clone()
    before_rng = torch.get_rng_state()
    # Non-requesting rows carry a chosen ID and a position no write could survive.
    rows = [(0, 9, 10**9), (1, 0, 3), (1, 2, 4), (2, 1, 5), (3, 9, 10**9), (4, 0, 6), (5, 9, 10**9)]
    frame.reduce(ReferenceLogprobReducer(vocab), logits, rows)

    assert torch.equal(logits.view(torch.int32), before_logits.view(torch.int32))
    assert torch.equal(torch.get_rng_state(), before_rng)
    for slot in (0, 3, 5):
        assert set(frame.out[slot].flatten().tolist()) == {SENTINEL}
    written = {(1, 0): NATURAL_TOP_K, (1, 2): NATURAL_TOP_K, (2, 1): 2, (4, 0): NATURAL_TOP_K}
    for slot in (1, 2, 4):
        for position in range(tokens):
            pairs = written.get((slot, position))
            if pairs is None:
                assert set(frame.out[slot, position].tolist()) == {SENTINEL}
            else:
                assert SENTINEL not in frame.out[slot, position, : 2 + 2 * pairs].tolist()
                assert set(frame.tail(slot, position, pairs)) == {SENTINEL}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_selected_ids_report_in_caller_order_beside_natural_lanes(dtype, device) -> None:
    vocab = 300
    generator = torch.Generator().manual_seed(5)
    logits = (torch.randn(4, vocab, generator=generator) * 3).to(dtype).to(device)
    chosen = [11, 200, 42, 7]
    many = torch.randperm(vocab, generator=generator)
    many = [i for i in many.tolist() if i != chosen[1]][:MAX_SELECTED_IDS]
    selections = {0: [11], 1: many, 3: [299, 7, 0]}
    frame = Frame(capacity=4, tokens=1, full=True, device=device)
    for slot in range(4):
        frame.request(slot, selections.get(slot))
    frame.reduce(
        ReferenceLogprobReducer(vocab), logits, [(slot, 0, chosen[slot]) for slot in range(4)]
    )

    expected = reference_values(logits, vocab)
    lse = reference_lse(logits, vocab)
    upcast = logits.float().cpu()
    for slot, ids in selections.items():
        pairs = frame.pairs(slot, count=len(ids))
        assert [token_id for token_id, _ in pairs] == ids
        for token_id, bits in pairs:
            assert_close_to_reference(
                bits,
                expected[slot, token_id].item(),
                upcast[slot, token_id].item(),
                lse[slot].item(),
            )
        assert set(frame.tail(slot, 0, len(ids))) <= {SENTINEL}
    assert frame.pairs(0, count=1)[0][1] == frame.chosen(0)[1]
    natural = [token_id for token_id, _ in frame.pairs(2)]
    # bf16 inputs tie exactly; distinct inputs differ by far more than FP32 rounding.
    by_value = sorted(range(vocab), key=lambda i: (-expected[2, i].item(), i))
    assert natural == by_value[:NATURAL_TOP_K]
    assert set(frame.tail(2, 0, NATURAL_TOP_K)) == {SENTINEL}


@pytest.mark.parametrize("device", DEVICES)
def test_a_chosen_token_outside_the_alternatives_still_gets_its_own_pair(device) -> None:
    vocab = 100
    logits = torch.linspace(5.0, -5.0, vocab, device=device)[None, :]
    frame = Frame(capacity=1, tokens=1, full=False, device=device)
    frame.request(0)
    frame.reduce(ReferenceLogprobReducer(vocab), logits, [(0, 0, 99)])

    token_id, bits = frame.chosen(0)
    assert token_id == 99
    assert 99 not in [i for i, _ in frame.pairs(0)]
    expected = reference_values(logits, vocab)[0, 99].item()
    assert_close_to_reference(bits, expected, -5.0, reference_lse(logits, vocab).item())


def test_no_requesting_row_leaves_the_frame_untouched() -> None:
    frame = Frame(capacity=2, tokens=1, full=True, device="cpu")
    frame.reduce(ReferenceLogprobReducer(10), torch.zeros(2, 10), [(0, 0, 1), (1, 0, 2)])
    assert set(frame.out.flatten().tolist()) == {SENTINEL}


@pytest.mark.parametrize(("vocab", "top_k"), [(0, 20), (10, 0), (10, 21)])
def test_a_reducer_rejects_an_empty_vocabulary_or_k_outside_one_to_twenty(vocab, top_k) -> None:
    with pytest.raises(ValueError):
        ReferenceLogprobReducer(vocab, top_k)


def test_reduce_rejects_integer_logits_narrow_rows_half_declared_ids_and_short_frames() -> None:
    reducer = ReferenceLogprobReducer(10)
    frame = Frame(capacity=1, tokens=1, full=True, device="cpu")
    frame.request(0)
    with pytest.raises(TypeError):
        frame.reduce(reducer, torch.zeros(1, 10, dtype=torch.int32), [(0, 0, 1)])
    with pytest.raises(ValueError):
        frame.reduce(reducer, torch.zeros(1, 9), [(0, 0, 1)])
    frame.token_ids = None
    with pytest.raises(ValueError):
        frame.reduce(reducer, torch.zeros(1, 10), [(0, 0, 1)])
    narrow = Frame(capacity=1, tokens=1, full=False, device="cpu", top_k=4)
    narrow.request(0)
    with pytest.raises(ValueError):
        narrow.reduce(reducer, torch.zeros(1, 10), [(0, 0, 1)])


_LOGIT_CHOICES = [0.0, -0.0, 1e-6, 1.0, 1.0000001, -3.5, 40.0, 7.25, -math.inf, -20.0, 0.5]


@settings(max_examples=60)
@given(
    vocab=st.integers(1, 40),
    top_k=st.integers(1, NATURAL_TOP_K),
    bfloat16=st.booleans(),
    data=st.data(),
)
def test_natural_alternatives_are_the_k_largest_keys_in_descending_order(
    vocab, top_k, bfloat16, data
) -> None:
    choices = st.one_of(st.sampled_from(_LOGIT_CHOICES), st.floats(-50, 50, width=32))
    row = data.draw(st.lists(choices, min_size=vocab, max_size=vocab))
    row[data.draw(st.integers(0, vocab - 1))] = 2.0  # at least one finite logit
    logits = torch.tensor([row, row], dtype=torch.float32)
    logits = logits.to(torch.bfloat16) if bfloat16 else logits
    frame = Frame(capacity=2, tokens=1, full=True, device="cpu")
    frame.request(0)
    frame.request(1, list(range(vocab)))  # every ID's reported value, same normalization
    frame.reduce(ReferenceLogprobReducer(vocab, top_k), logits, [(0, 0, 0), (1, 0, 0)])

    every = dict(frame.pairs(1, count=vocab))
    ranked = sorted(range(vocab), key=lambda i: sort_key(value(every[i]), i), reverse=True)
    pairs = frame.pairs(0, count=top_k)
    expected = ranked[:top_k] + [-1] * (top_k - min(top_k, vocab))
    assert [token_id for token_id, _ in pairs] == expected
    assert [bits for token_id, bits in pairs if token_id >= 0] == [every[i] for i in ranked[:top_k]]
    keys = [sort_key(value(bits), token_id) for token_id, bits in pairs if token_id >= 0]
    assert keys == sorted(keys, reverse=True)


@pytest.mark.parametrize("device", DEVICES)
def test_rows_read_where_they_lie_stay_unchanged_and_report_what_a_selection_of_them_does(
    device,
) -> None:
    """When every row requests, the reducer reads the logits in place (padded lanes and all)
    instead of a selected copy: the words must be the copy's, and the logits untouched."""
    vocab = 300
    generator = torch.Generator().manual_seed(5)
    logits = padded(torch.randn(3, vocab, generator=generator) * 4, 12, 7.0).to(device)
    before = logits.clone()
    in_place = Frame(4, 1, full=True, device=device)
    selected = Frame(4, 1, full=True, device=device)
    for frame in (in_place, selected):
        frame.request(0)
        frame.request(1, [5, 299, 17])
        frame.request(2)
    rows = [(0, 0, 3), (1, 0, 4), (2, 0, 5)]

    in_place.reduce(ReferenceLogprobReducer(vocab), logits, rows)
    # A fourth row whose slot does not request makes the reducer select the other three.
    extra = torch.cat([logits, torch.randn(1, logits.shape[1], generator=generator).to(device)])
    selected.reduce(ReferenceLogprobReducer(vocab), extra, [*rows, (3, 0, 1)])

    assert torch.equal(logits.view(torch.int32), before.view(torch.int32))
    assert torch.equal(in_place.out[:3], selected.out[:3])
    assert SENTINEL not in in_place.out[:3, 0, :8].flatten().tolist()
