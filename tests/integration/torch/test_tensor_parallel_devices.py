"""Every tensor-parallel rank makes its own GPU current before any CUDA work (no GPU needed)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from adapters.gpu.distributed.devices import claim_device, rank_device
from adapters.gpu.distributed.group import Rendezvous, free_port
from adapters.gpu.distributed.launch import run_peer


class Selected(Exception):
    """Raised by the stand-in once a device is selected: nothing after it may run."""


class RecordingCuda:
    """A CUDA runtime stand-in that records which devices were made current."""

    def __init__(self, available: bool = True, stop: bool = False) -> None:
        self.available = available
        self.stop = stop
        self.selected: list[torch.device] = []

    def is_available(self) -> bool:
        return self.available

    def set_device(self, device: torch.device) -> None:
        self.selected.append(device)
        if self.stop:
            raise Selected


@pytest.mark.parametrize(
    ("kind", "local_rank", "available", "expected"),
    [
        ("cuda", 0, True, torch.device("cuda", 0)),
        ("cuda", 3, False, torch.device("cuda", 3)),
        ("auto", 1, True, torch.device("cuda", 1)),
        ("auto", 1, False, torch.device("cpu")),
        ("cpu", 2, True, torch.device("cpu")),
    ],
)
def test_a_rank_runs_on_the_gpu_of_its_local_rank_or_on_the_cpu(
    kind, local_rank, available, expected
):
    assert rank_device(kind, local_rank, available) == expected


@pytest.mark.parametrize(("kind", "local_rank"), [("tpu", 0), ("cuda", -1)])
def test_an_unknown_device_kind_or_a_negative_local_rank_is_refused(kind, local_rank):
    with pytest.raises(ValueError):
        rank_device(kind, local_rank, True)


def test_a_cuda_rank_makes_its_own_gpu_current():
    cuda = RecordingCuda()

    assert claim_device("auto", 2, cuda) == torch.device("cuda", 2)
    assert cuda.selected == [torch.device("cuda", 2)]


@pytest.mark.parametrize(("kind", "available"), [("cpu", True), ("auto", False)])
def test_a_cpu_rank_selects_no_gpu(kind, available):
    cuda = RecordingCuda(available)

    assert claim_device(kind, 1, cuda) == torch.device("cpu")
    assert cuda.selected == []


def test_a_peer_selects_its_gpu_before_it_joins_the_world():
    # The stand-in stops the peer at the selection: had the peer joined first, it would wait
    # for a rank 0 that never comes (or start NCCL on GPU 0), and no group may exist yet.
    cuda = RecordingCuda(stop=True)
    rendezvous = Rendezvous("127.0.0.1", free_port(), 2, 1, 1, timeout_s=5)

    with pytest.raises(Selected):
        run_peer(rendezvous, "cuda", 2, cuda)

    assert cuda.selected == [torch.device("cuda", 1)]
    assert not dist.is_initialized()
