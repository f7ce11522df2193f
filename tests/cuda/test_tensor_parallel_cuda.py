"""On two GPUs: Triton launches whose tensors live on a GPU that is not current, as on rank 1."""

from __future__ import annotations

import pytest
import torch

from adapters.gpu.distributed.devices import claim_device
from adapters.gpu.logprobs import triton_launches_vp
from adapters.gpu.logprobs.normalizer import LSE_TILE
from adapters.gpu.logprobs.reducer import ReductionInputs
from adapters.gpu.logprobs.reference_reducer import ReferenceLogprobReducer
from adapters.gpu.logprobs.reference_reducer_vp import EXCHANGE_WORDS
from adapters.gpu.logprobs.triton_reducer import TritonLogprobReducer
from domain.logprobs.values import NATURAL_TOP_K

# tests/conftest.py skips these where there is no CUDA device; one GPU skips them here.
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2,
        reason="a launch on a GPU that is not current needs two GPUs",
    ),
]

VOCAB = 151_936
ROWS = 8
SENTINEL = 0x5A5A5A5A
CURRENT, OTHER = torch.device("cuda", 0), torch.device("cuda", 1)


def _batch(device: torch.device) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(3)
    logits = (torch.randn(ROWS, VOCAB, generator=generator) * 4.0).to(torch.bfloat16)
    slots = torch.arange(ROWS, dtype=torch.int64)
    positions = torch.zeros(ROWS, dtype=torch.int64)
    chosen = torch.randint(VOCAB, (ROWS,), generator=generator)
    requested = torch.ones(ROWS, dtype=torch.int32)
    return tuple(t.to(device) for t in (logits, slots, positions, chosen, requested))


def _reduced(reducer, device: torch.device) -> torch.Tensor:
    logits, slots, positions, chosen, requested = _batch(device)
    out = torch.full((ROWS, 1, 2 + 2 * NATURAL_TOP_K), SENTINEL, dtype=torch.int32, device=device)
    reducer.reduce(ReductionInputs(logits, slots, positions, chosen, requested, None, None, out))
    torch.cuda.synchronize(device)
    return out.cpu()


def test_the_reducer_launches_on_its_tensors_gpu_when_another_is_current() -> None:
    torch.cuda.set_device(CURRENT)

    got = _reduced(TritonLogprobReducer(VOCAB), OTHER)

    assert torch.cuda.current_device() == CURRENT.index  # the guard restores the current GPU
    assert torch.equal(got, _reduced(ReferenceLogprobReducer(VOCAB), torch.device("cpu")))


def test_a_vocab_parallel_launch_on_a_gpu_that_is_not_current_writes_the_current_gpu_words():
    torch.cuda.set_device(CURRENT)
    width = VOCAB // 2

    def statistics(device: torch.device) -> torch.Tensor:
        logits, slots, _, _, requested = _batch(device)
        tiles = -(-width // LSE_TILE)
        stats = torch.zeros(ROWS, tiles, 2, device=device)
        send = torch.zeros(ROWS, EXCHANGE_WORDS, dtype=torch.int32, device=device)
        triton_launches_vp.statistics(logits[:, :width], slots, requested, stats, send, width)
        torch.cuda.synchronize(device)
        return send.cpu()

    expected = statistics(CURRENT)
    assert expected.any()
    assert torch.equal(statistics(OTHER), expected)


def test_a_rank_claims_the_gpu_of_its_local_rank() -> None:
    torch.cuda.set_device(CURRENT)
    try:
        assert claim_device("cuda", 1) == OTHER
        assert torch.cuda.current_device() == 1
    finally:
        torch.cuda.set_device(CURRENT)
