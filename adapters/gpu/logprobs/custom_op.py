"""The whole Triton reduction as one torch custom op, for compiled and graph-captured forwards."""

from __future__ import annotations

import torch

from adapters.gpu.logprobs.reducer import ReductionInputs
from adapters.gpu.logprobs.triton_reducer import TritonLogprobReducer

_REDUCERS: dict[tuple[int, int], TritonLogprobReducer] = {}
_OPERATOR = None


def logprob_reduce_operator():
    """`torch.ops.helios.logprob_reduce`, registered on first use: the whole reduction as one
    custom op that mutates `out` opaquely, so a compiler keeps its order with the logits.

    Parked: a compiled, graph-captured forward will call this; serving reduces eagerly.

    Arguments: the `ReductionInputs` fields in order, then `vocab_size` and `top_k`; one
    reducer (and its workspaces) is kept per (vocab_size, top_k).
    """
    global _OPERATOR
    if _OPERATOR is None:

        @torch.library.custom_op("helios::logprob_reduce", mutates_args=("out",))
        def logprob_reduce(
            logits: torch.Tensor,
            slots: torch.Tensor,
            positions: torch.Tensor,
            chosen: torch.Tensor,
            requested: torch.Tensor,
            counts: torch.Tensor | None,
            token_ids: torch.Tensor | None,
            out: torch.Tensor,
            vocab_size: int,
            top_k: int,
        ) -> None:
            reducer = _REDUCERS.get((vocab_size, top_k))
            if reducer is None:
                reducer = _REDUCERS[(vocab_size, top_k)] = TritonLogprobReducer(vocab_size, top_k)
            inputs = ReductionInputs(
                logits, slots, positions, chosen, requested, counts, token_ids, out
            )
            reducer.reduce(inputs)

        @logprob_reduce.register_fake
        def _(*arguments) -> None:  # the only effect is the opaque write into `out`
            return None

        _OPERATOR = logprob_reduce
    return _OPERATOR
