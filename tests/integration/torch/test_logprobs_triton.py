"""Triton logprob reduction: the packed frame equals the torch reference's bit for bit."""

from __future__ import annotations

import math
import os

import pytest
import torch

if not torch.cuda.is_available():
    # Without a GPU the kernels run in Triton's interpreter, which must be chosen before import.
    os.environ["TRITON_INTERPRET"] = "1"

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the environment
    pytest.skip("triton is not installed: the Triton reducer cannot run", allow_module_level=True)

from adapters.gpu.logprobs.custom_op import logprob_reduce_operator
from adapters.gpu.logprobs.keys import order_keys
from adapters.gpu.logprobs.normalizer import LSE_TILE
from adapters.gpu.logprobs.reducer import ReductionInputs
from adapters.gpu.logprobs.reference_reducer import ReferenceLogprobReducer
from adapters.gpu.logprobs.triton_reducer import TritonLogprobReducer, tl_order_keys
from domain.logprobs.values import FULL_POSITION_WORDS, MAX_SELECTED_IDS, NATURAL_TOP_K

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SENTINEL = 0x5A5A5A5A


class Case:
    """One frame's request inputs and the rows to reduce, run through both reducers."""

    def __init__(self, capacity: int, tokens: int, *, full: bool, top_k: int = NATURAL_TOP_K):
        self.capacity, self.tokens, self.full, self.top_k = capacity, tokens, full, top_k
        self.requested = torch.zeros(capacity, dtype=torch.int32)
        self.counts = torch.zeros(capacity, dtype=torch.int32) if full else None
        # Stale IDs past each uploaded prefix: huge and negative, never valid read indices.
        stale = torch.tensor([10**6, -5], dtype=torch.int32)
        self.token_ids = stale.repeat(capacity, MAX_SELECTED_IDS // 2) if full else None

    def request(self, slot: int, token_ids: list[int] | None = None) -> None:
        self.requested[slot] = 1
        if token_ids:
            self.counts[slot] = len(token_ids)
            self.token_ids[slot, : len(token_ids)] = torch.tensor(token_ids, dtype=torch.int32)

    def run(self, reducer, logits: torch.Tensor, rows: list[tuple[int, int, int]]) -> torch.Tensor:
        """rows: (slot, position, chosen) of each logits row; returns the sentinel-filled frame."""
        words = FULL_POSITION_WORDS if self.full else 2 + 2 * self.top_k
        out = torch.full(
            (self.capacity, self.tokens, words), SENTINEL, dtype=torch.int32, device=DEVICE
        )

        def column(i: int) -> torch.Tensor:
            return torch.tensor([row[i] for row in rows], dtype=torch.int64, device=DEVICE)

        def moved(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return None if tensor is None else tensor.to(DEVICE)

        reducer.reduce(
            ReductionInputs(
                logits.to(DEVICE),
                column(0),
                column(1),
                column(2),
                self.requested.to(DEVICE),
                moved(self.counts),
                moved(self.token_ids),
                out,
            )
        )
        return out.cpu()

    def both(self, vocab: int, logits: torch.Tensor, rows) -> tuple[torch.Tensor, torch.Tensor]:
        reference = self.run(ReferenceLogprobReducer(vocab, self.top_k), logits, rows)
        triton_out = self.run(TritonLogprobReducer(vocab, self.top_k), logits, rows)
        return reference, triton_out


def assert_bit_equal(reference: torch.Tensor, got: torch.Tensor) -> None:
    differing = (reference != got).nonzero().tolist()
    assert not differing, f"{len(differing)} words differ, first at {differing[:4]}"


def padded(logits: torch.Tensor, lanes: int, fill: float) -> torch.Tensor:
    return torch.cat([logits, torch.full((logits.shape[0], lanes), fill, dtype=logits.dtype)], 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_random_rows_over_several_tiles_match_the_reference_bit_for_bit(dtype) -> None:
    vocab = 3 * LSE_TILE - 72  # three tiles, the last one partial
    generator = torch.Generator().manual_seed(17)
    real = (torch.randn(5, vocab, generator=generator) * 5).to(dtype)
    logits = padded(real, 72, 1e4)  # padded lanes huge but finite in every dtype
    case = Case(capacity=4, tokens=2, full=True)
    case.request(0)
    case.request(1, [vocab - 1, 3, vocab, 1500, -1])
    case.request(3)
    rows = [(0, 0, 7), (1, 1, 2047), (2, 0, 9), (3, 1, vocab + 5), (0, 1, 0)]

    reference, got = case.both(vocab, logits, rows)

    assert_bit_equal(reference, got)
    assert set(got[2].flatten().tolist()) == {SENTINEL}


def test_exact_ties_at_the_cutoff_select_the_same_smallest_ids() -> None:
    vocab = 64
    logits = torch.full((1, vocab), -2.0)
    logits[0, [40, 45, 10]] = torch.tensor([3.0, 2.5, 2.0])
    logits[0, [63, 2, 50, 7, 33, 11, 48, 0, 21, 36, 59, 5, 17, 29, 44, 13, 52, 26, 38]] = 1.0
    case = Case(capacity=1, tokens=1, full=False)
    case.request(0)

    reference, got = case.both(vocab, logits.to(torch.bfloat16), [(0, 0, 40)])

    assert_bit_equal(reference, got)
    assert got[0, 0, 2::2].tolist()[:5] == [40, 45, 10, 0, 2]


def test_ties_across_tiles_keep_the_smallest_ids_from_every_tile() -> None:
    vocab = 2 * LSE_TILE + 40
    logits = torch.full((1, vocab), -3.0)
    tied = [2 * LSE_TILE + 39, 5, LSE_TILE + 1, 2 * LSE_TILE, LSE_TILE - 1] + list(range(40, 80))
    logits[0, tied] = 1.5
    case = Case(capacity=1, tokens=1, full=True)
    case.request(0)

    reference, got = case.both(vocab, logits, [(0, 0, 5)])

    assert_bit_equal(reference, got)
    assert got[0, 0, 2 : 2 + 2 * NATURAL_TOP_K : 2].tolist() == sorted(tied)[:NATURAL_TOP_K]


@pytest.mark.parametrize("top_k", [2, NATURAL_TOP_K])
def test_ties_created_by_the_subtraction_match_the_reference(top_k) -> None:
    vocab = 8
    logits = torch.full((1, vocab), -math.inf)
    logits[0, 0], logits[0, 3], logits[0, 6] = 40.0, 0.0, 1e-6
    case = Case(capacity=1, tokens=1, full=False, top_k=top_k)
    case.request(0)

    reference, got = case.both(vocab, logits, [(0, 0, 6)])

    assert_bit_equal(reference, got)
    expected = [0, 3, 6, 1, 2, 4, 5, 7] + [-1] * 12
    assert got[0, 0, 2 : 2 + 2 * top_k : 2].tolist() == expected[:top_k]


@triton.jit
def _keys_kernel(values, token_ids, keys, BLOCK: tl.constexpr):
    index = tl.arange(0, BLOCK)
    tl.store(keys + index, tl_order_keys(tl.load(values + index), tl.load(token_ids + index)))


def test_signed_zero_and_extreme_values_get_the_reference_sort_keys() -> None:
    values = torch.tensor(
        [-0.0, 0.0, -0.0, 0.0, -1e-45, 1e-45, -math.inf, math.inf, -3.5, 2.25, -1e38, 1e38]
        + [0.0] * 4
    )
    ids = torch.tensor([5, 2, 1, 9, 0, 4, 7, 3, 2**31 - 1, 0, 11, 12, 13, 14, 15, 16])
    keys = torch.empty(16, dtype=torch.int64, device=DEVICE)

    _keys_kernel[(1,)](values.to(DEVICE), ids.to(torch.int32).to(DEVICE), keys, BLOCK=16)

    assert keys.cpu().tolist() == order_keys(values, ids).tolist()


def test_a_reported_negative_zero_keeps_its_bits_in_both_reducers() -> None:
    logits = torch.full((2, 4), -math.inf)
    logits[0, 1], logits[1, 2] = -0.0, 0.0
    case = Case(capacity=2, tokens=1, full=False)
    case.request(0)
    case.request(1)

    reference, got = case.both(4, logits, [(0, 0, 1), (1, 0, 2)])

    assert_bit_equal(reference, got)
    assert got[0, 0, 1].item() == -(2**31)  # -0.0


@pytest.mark.parametrize("full", [False, True])
def test_a_vocabulary_smaller_than_k_matches_with_minus_one_ids(full) -> None:
    vocab = 5
    logits = padded(torch.tensor([[0.5, 2.0, -1.0, 2.0, 0.0]]), 3, 1e30)
    case = Case(capacity=1, tokens=2, full=full)
    case.request(0)

    reference, got = case.both(vocab, logits, [(0, 1, 2)])

    assert_bit_equal(reference, got)
    assert got[0, 1, 12 : 2 + 2 * NATURAL_TOP_K : 2].tolist() == [-1] * 15


def test_padded_lanes_with_huge_or_infinite_logits_never_enter() -> None:
    vocab = LSE_TILE + 30  # the padding shares the second tile with real lanes
    generator = torch.Generator().manual_seed(3)
    real = torch.randn(2, vocab, generator=generator)
    wide = padded(padded(real, 17, 1e30), 1, math.inf)
    case = Case(capacity=2, tokens=1, full=True)
    case.request(0)
    case.request(1, [vocab - 1, 0, vocab, vocab + 16])
    rows = [(0, 0, 4), (1, 0, vocab - 1)]

    narrow_out = case.run(TritonLogprobReducer(vocab), real, rows)
    reference, got = case.both(vocab, wide, rows)

    assert_bit_equal(reference, got)
    assert torch.equal(narrow_out, got)


# inf * 0 and -inf - -inf arise in lanes whose results are discarded, as in the reference.
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_infinite_and_extreme_rows_match_the_reference() -> None:
    vocab = 2 * LSE_TILE
    logits = torch.full((5, vocab), -math.inf)
    logits[0, [29, 15, 1500]] = torch.tensor([1.0, 3.0, 2.0])  # mostly -inf
    logits[1, LSE_TILE:] = -300.0 + torch.arange(LSE_TILE) * 1e-3  # first tile holds no mass
    logits[2] = -1e4  # every logit far below zero
    logits[3, 7] = math.inf
    # Row 4 stays all -inf.
    case = Case(capacity=5, tokens=1, full=False)
    for slot in range(5):
        case.request(slot)

    reference, got = case.both(vocab, logits, [(slot, 0, 15) for slot in range(5)])

    assert_bit_equal(reference, got)


def test_non_requesting_lanes_stay_untouched_beside_requesting_ones() -> None:
    vocab, capacity, tokens = 50, 6, 3
    generator = torch.Generator().manual_seed(11)
    logits = torch.randn(7, vocab, generator=generator)
    before = logits.clone()
    case = Case(capacity, tokens, full=True)
    for slot in (1, 4):
        case.request(slot)
    case.request(2, [7, 3])
    # Non-requesting rows carry a chosen ID and a position no write could survive.
    rows = [(0, 9, 10**9), (1, 0, 3), (1, 2, 4), (2, 1, 5), (3, 9, 10**9), (4, 0, 6), (5, 9, 10**9)]

    reference, got = case.both(vocab, logits, rows)

    assert_bit_equal(reference, got)
    assert torch.equal(logits.view(torch.int32), before.view(torch.int32))
    for slot in (0, 3, 5):
        assert set(got[slot].flatten().tolist()) == {SENTINEL}
    assert set(got[2, 1, 6:].tolist()) == {SENTINEL}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_and_one_hundred_twenty_eight_selected_ids_report_in_caller_order(dtype) -> None:
    vocab = 300
    generator = torch.Generator().manual_seed(5)
    logits = (torch.randn(3, vocab, generator=generator) * 3).to(dtype)
    many = torch.randperm(vocab, generator=generator)[:MAX_SELECTED_IDS].tolist()
    case = Case(capacity=3, tokens=1, full=True)
    case.request(0, [11])
    case.request(1, many)
    case.request(2)

    reference, got = case.both(vocab, logits, [(0, 0, 11), (1, 0, 200), (2, 0, 42)])

    assert_bit_equal(reference, got)
    assert got[1, 0, 2::2].tolist() == many
    assert got[0, 0, 2].item() == 11 and set(got[0, 0, 4:].tolist()) == {SENTINEL}


def test_workspaces_are_allocated_once_and_reused_for_fewer_rows() -> None:
    vocab = 40
    reducer = TritonLogprobReducer(vocab)
    case = Case(capacity=3, tokens=1, full=False)
    case.request(1)
    generator = torch.Generator().manual_seed(2)
    logits = torch.randn(3, vocab, generator=generator)

    case.run(reducer, logits, [(0, 0, 1), (1, 0, 2), (2, 0, 3)])
    first = [tensor.data_ptr() for tensor in reducer._workspace]
    got = case.run(reducer, logits[1:2], [(1, 0, 2)])
    reference = case.run(ReferenceLogprobReducer(vocab), logits[1:2], [(1, 0, 2)])

    assert [tensor.data_ptr() for tensor in reducer._workspace] == first
    assert_bit_equal(reference, got)


_TIE_PRONE = [0.0, -0.0, 1e-6, 1.0, 1.0000001, -3.5, 40.0, 7.25, -math.inf, -20.0, 0.5]


@pytest.mark.parametrize("seed", range(6))
def test_small_tie_prone_vocabularies_match_the_reference(seed) -> None:
    generator = torch.Generator().manual_seed(seed)
    vocab = int(torch.randint(1, 41, (1,), generator=generator))
    top_k = int(torch.randint(1, NATURAL_TOP_K + 1, (1,), generator=generator))
    picks = torch.randint(0, len(_TIE_PRONE), (2, vocab), generator=generator)
    logits = torch.tensor(_TIE_PRONE)[picks]
    logits[:, 0] = 2.0
    logits[1] += torch.randn(vocab, generator=generator) * (seed % 2)
    dtype = torch.bfloat16 if seed % 3 == 0 else torch.float32
    case = Case(capacity=2, tokens=1, full=True, top_k=top_k)
    case.request(0)
    case.request(1, list(range(vocab)))

    reference, got = case.both(vocab, logits.to(dtype), [(0, 0, 0), (1, 0, vocab - 1)])

    assert_bit_equal(reference, got)


def test_the_custom_operator_writes_what_the_reducer_writes() -> None:
    vocab = 70
    generator = torch.Generator().manual_seed(9)
    logits = torch.randn(2, vocab, generator=generator)
    case = Case(capacity=2, tokens=1, full=True)
    case.request(0)
    case.request(1, [3, 69])
    rows = [(0, 0, 1), (1, 0, 2)]
    operator = logprob_reduce_operator()

    class Operator:
        def reduce(self, inputs: ReductionInputs) -> None:
            operator(*inputs, vocab, NATURAL_TOP_K)

    reference = case.run(ReferenceLogprobReducer(vocab), logits, rows)
    got = case.run(Operator(), logits, rows)

    assert_bit_equal(reference, got)
    assert logprob_reduce_operator() is operator
