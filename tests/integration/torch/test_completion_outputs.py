"""The completion bundle's upload rules, frames and W-wide read-back (reference reducer, CPU)."""

from __future__ import annotations

import pytest
import torch

from adapters.gpu.logprobs.completion_outputs import CompletionOutputs
from domain.contract.capabilities import LogprobCapability
from domain.contract.geometry import ExecutorGeometry
from domain.contract.records import CompletionRecord, Role
from domain.engine.step import SlotWork
from domain.logprobs.values import LogprobOptions
from domain.requests.choice_sampling import LaneSampling
from domain.requests.sampling import SamplingParams
from tests.support.geometry import fake_geometry

VOCAB = 50


@pytest.fixture(params=["reference", "triton"])
def backend(request) -> str:
    """The bundle behaves the same whichever reducer fills it."""
    return request.param


def geometry(top_k: int = 20, selects: bool = True) -> ExecutorGeometry:
    return fake_geometry(
        num_blocks=8,
        vocab_size=VOCAB,
        max_model_len=32,
        logprobs=LogprobCapability(top_k=top_k, selects_ids=selects),
    )


def lane(slot: int, logprobs: LogprobOptions | None) -> SlotWork:
    return SlotWork(
        slot=slot,
        epoch=1,
        token_ids=(1,),
        start_position=3,
        block_table=(slot,),
        prompt_len=2,
        sample=True,
        sampling=LaneSampling(SamplingParams(), 0, logprobs=logprobs),
    )


def test_a_core_without_logprob_buffers_allocates_none_and_never_requests(backend):
    outputs = CompletionOutputs(geometry(top_k=0, selects=False), torch.device("cpu"), backend)

    assert outputs.buffers is None
    assert outputs.upload(0, [lane(0, LogprobOptions(top_k=2))]) is False


def test_upload_writes_full_flag_and_count_vectors_and_the_selecting_slots_id_prefix(backend):
    outputs = CompletionOutputs(geometry(), torch.device("cpu"), backend)

    outputs.upload(
        0,
        [
            lane(1, LogprobOptions(top_k=3)),
            lane(2, None),
            lane(5, LogprobOptions(token_ids=(7, 4, 9))),
        ],
    )

    assert outputs.buffers.requested.tolist() == [0, 1, 0, 0, 0, 1, 0, 0]
    assert outputs.buffers.counts.tolist() == [0, 0, 0, 0, 0, 3, 0, 0]
    assert outputs.buffers.token_ids[5, :3].tolist() == [7, 4, 9]


def test_the_next_submission_clears_flags_and_counts_of_lanes_it_does_not_request(backend):
    outputs = CompletionOutputs(geometry(), torch.device("cpu"), backend)
    outputs.upload(0, [lane(5, LogprobOptions(token_ids=(7, 4)))])

    outputs.upload(1, [lane(5, None), lane(6, LogprobOptions(top_k=1))])

    assert outputs.buffers.requested.tolist() == [0, 0, 0, 0, 0, 0, 1, 0]
    assert outputs.buffers.counts.tolist() == [0] * 8


def test_read_decodes_only_requesting_lanes_and_never_stale_payload(backend):
    outputs = CompletionOutputs(geometry(), torch.device("cpu"), backend)
    outputs.buffers.logprobs.fill_(123)  # stale words a reader must never decode
    works = [
        lane(0, LogprobOptions(top_k=2)),
        lane(1, None),
        lane(2, LogprobOptions(token_ids=(3,))),
    ]
    outputs.upload(0, works)
    logits = torch.randn(3, VOCAB + 6)  # six padded LM-head lanes
    chosen = torch.tensor([4, 5, 6])

    outputs.reduce(0, logits, [0, 1, 2], [w.slot for w in works], [0, 0, 0], chosen.tolist())
    outputs.commit(
        0,
        [
            CompletionRecord(w.slot, 1, Role.SAMPLE, (int(t),))
            for w, t in zip(works, chosen, strict=True)
        ],
    )
    result = outputs.read(0)

    first, second, third = result.logprobs
    assert second is None
    assert first[0].chosen.token_id == 4 and len(first[0].alternatives) == 2
    assert [a.token_id for a in third[0].alternatives] == [3]
    expected = torch.log_softmax(logits[:, :VOCAB].double(), dim=-1)
    assert abs(first[0].chosen.logprob - expected[0, 4].item()) < 1e-5
    assert abs(third[0].alternatives[0].logprob - expected[2, 3].item()) < 1e-5


def test_each_lane_decodes_the_alternatives_it_asked_for_from_the_same_wide_copy(backend):
    outputs = CompletionOutputs(geometry(), torch.device("cpu"), backend)
    works = [
        lane(0, LogprobOptions(top_k=0)),
        lane(1, LogprobOptions(top_k=5)),
        lane(2, LogprobOptions(top_k=20)),
    ]
    outputs.upload(0, works)
    logits = torch.randn(6, VOCAB)
    chosen = [4, 5, 6, 7, 8, 9]
    outputs.reduce(0, logits, list(range(6)), [0, 0, 1, 1, 2, 2], [0, 1] * 3, chosen)
    outputs.commit(
        0,
        [
            CompletionRecord(w.slot, 1, Role.SAMPLE, tuple(chosen[2 * w.slot : 2 * w.slot + 2]))
            for w in works
        ],
    )

    result = outputs.read(0)

    expected = torch.log_softmax(logits.double(), dim=-1)
    natural = expected.argsort(dim=-1, descending=True, stable=True)
    for slot, asked in enumerate((0, 5, 20)):
        for index, position in enumerate(result.logprobs[slot]):
            row = 2 * slot + index
            assert position.chosen.token_id == chosen[row]
            assert position.alternative_ids == tuple(natural[row, :asked].tolist())
            assert all(
                abs(value - expected[row, token].item()) < 1e-5
                for token, value in zip(
                    position.alternative_ids, position.alternative_logprobs, strict=True
                )
            )
    # The copy is the contract's: every requesting lane's T positions, W = K = 20 pairs wide.
    assert result.payload_bytes == 3 * 8 * (2 + 2 * 20) * 4


def test_a_frame_without_requesting_lanes_returns_no_payload(backend):
    outputs = CompletionOutputs(geometry(), torch.device("cpu"), backend)
    outputs.upload(1, [lane(0, None)])
    outputs.commit(1, [CompletionRecord(0, 1, Role.SAMPLE, (4,))])

    assert outputs.read(1).logprobs == ()


class _Recording:
    """A reducer that keeps every call's inputs and hands it on."""

    def __init__(self, reducer) -> None:
        self.reducer, self.calls = reducer, []

    def reduce(self, inputs) -> None:
        self.calls.append(inputs)
        self.reducer.reduce(inputs)


def test_the_reducer_gets_id_inputs_only_while_a_slot_selects_and_writes_the_same_words(backend):
    outputs = CompletionOutputs(geometry(), torch.device("cpu"), backend)
    recording = outputs._reducer = _Recording(outputs._reducer)
    logits = torch.randn(2, VOCAB)
    natural = [lane(0, LogprobOptions(top_k=20)), lane(1, LogprobOptions(top_k=3))]

    outputs.upload(0, natural)
    outputs.reduce(0, logits, [0, 1], [0, 1], [0, 0], [4, 5])
    outputs.upload(1, [natural[0], lane(1, LogprobOptions(token_ids=(9, 2)))])
    outputs.reduce(1, logits, [0, 1], [0, 1], [0, 0], [4, 5])

    without, with_ids = recording.calls
    assert without.counts is None and without.token_ids is None
    assert with_ids.counts is outputs.buffers.counts
    # In order, every row reduced: the logits themselves, no copy.
    assert without.logits is logits and with_ids.logits is logits
    # Slot 0 asked the same in both frames; the merge with selected IDs leaves its words alone.
    words = outputs.buffers.logprobs
    assert torch.equal(words[0, 0, 0], words[1, 0, 0])
    assert words[1, 1, 0, 2:6].tolist()[::2] == [9, 2]


def test_rows_out_of_order_reach_the_reducer_as_a_selection(backend):
    outputs = CompletionOutputs(geometry(), torch.device("cpu"), backend)
    recording = outputs._reducer = _Recording(outputs._reducer)
    logits = torch.randn(3, VOCAB)
    outputs.upload(0, [lane(0, LogprobOptions(top_k=2)), lane(1, LogprobOptions(top_k=2))])

    outputs.reduce(0, logits, [2, 0], [0, 1], [0, 0], [4, 5])

    (inputs,) = recording.calls
    assert torch.equal(inputs.logits, logits[[2, 0]])
