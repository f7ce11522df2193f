"""Row-wise building blocks the decoder's layers share: RMS norm and row-parallel projections."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from adapters.gpu.distributed.collectives import Collectives

Linear = Callable[..., torch.Tensor]


def rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Root-mean-square norm computed in float32, then scaled in the model dtype (as HF)."""
    as_float = hidden.to(torch.float32)
    variance = as_float.pow(2).mean(-1, keepdim=True)
    return weight * (as_float * torch.rsqrt(variance + eps)).to(hidden.dtype)


def row_parallel(
    rows: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    collectives: Collectives | None,
    linear: Linear = F.linear,
) -> torch.Tensor:
    """`rows @ weight.T + bias` where each rank holds some input columns: the partial products
    are summed across ranks before the (whole) bias joins once."""
    if collectives is None:
        return linear(rows, weight, bias)
    partial = linear(rows, weight)
    collectives.all_reduce(partial, "model")
    return partial if bias is None else partial + bias
