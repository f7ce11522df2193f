"""Which device a tensor-parallel rank runs on, made current before the rank's first CUDA work."""

from __future__ import annotations

from typing import Protocol

import torch


class CudaRuntime(Protocol):
    """What choosing a rank's device asks of CUDA (`torch.cuda` itself, or a test's stand-in)."""

    def is_available(self) -> bool: ...

    def set_device(self, device: torch.device) -> None: ...


def rank_device(kind: str, local_rank: int, cuda_available: bool) -> torch.device:
    """The device of the rank with `local_rank` on its machine for a `--device` kind: on CUDA
    (`cuda`, or `auto` where CUDA is available) the machine's GPU `local_rank`, else the CPU."""
    if kind not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, not {kind!r}")
    if local_rank < 0:
        raise ValueError(f"a local rank is >= 0, got {local_rank}")
    if kind == "cuda" or (kind == "auto" and cuda_available):
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def claim_device(kind: str, local_rank: int, cuda: CudaRuntime = torch.cuda) -> torch.device:
    """`rank_device`, made this process's current CUDA device before anything touches CUDA.

    Everything that takes the current device rather than a tensor's would otherwise run on
    cuda:0 for every rank: NCCL's communicator, events and streams made without a device, and
    Triton launches, which would read rank r's pointers from GPU 0.
    """
    device = rank_device(kind, local_rank, cuda.is_available())
    if device.type == "cuda":
        cuda.set_device(device)
    return device
