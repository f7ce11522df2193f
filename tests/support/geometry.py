"""Executor geometries for tests over the fake executor: the usual sizes in one place."""

from __future__ import annotations

from typing import Any

from domain.contract.geometry import ExecutorGeometry

SIZES = {
    "capacity": 8,
    "block_size": 4,
    "num_blocks": 64,
    "vocab_size": 64,
    "max_model_len": 64,
    "token_capacity": 8,
}
# The full logprob core: K = 20 natural entries plus the selected IDs.
FULL_CORE = {"logprob_top_k": 20, "selects_logprob_ids": True}


def fake_geometry(*, logprobs: bool = True, **fields: Any) -> ExecutorGeometry:
    """Eight slots, 4-token blocks and a 64-token vocabulary unless `fields` say otherwise;
    with the full logprob core unless `logprobs` is False."""
    return ExecutorGeometry(**{**SIZES, **(FULL_CORE if logprobs else {}), **fields})
