"""Executor geometries for tests over the fake executor: the usual sizes in one place."""

from __future__ import annotations

from typing import Any

from domain.contract.capabilities import FULL_LOGPROBS, LogprobCapability
from domain.contract.geometry import ExecutorGeometry

SIZES = {
    "capacity": 8,
    "block_size": 4,
    "num_blocks": 64,
    "vocab_size": 64,
    "max_model_len": 64,
    "token_capacity": 8,
}


def fake_geometry(
    *, logprobs: LogprobCapability = FULL_LOGPROBS, **fields: Any
) -> ExecutorGeometry:
    """Eight slots, 4-token blocks and a 64-token vocabulary unless `fields` say otherwise;
    with the full logprob core (K = 20 plus selected IDs) unless `logprobs` says otherwise."""
    return ExecutorGeometry(**{**SIZES, **fields}, logprobs=logprobs)
