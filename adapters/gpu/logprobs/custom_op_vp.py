"""The vocabulary-parallel Triton steps as torch custom ops, opaque writes a compiler keeps."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from adapters.gpu.logprobs import triton_launches_vp as launches


@dataclass(frozen=True, slots=True)
class VocabParallelOperators:
    """The custom ops between the exchanges, each writing only the buffers it names.

    `statistics(logits, slots, requested, stats, send, width)` writes stats and send;
    `candidates(logits, slots, chosen, requested, counts, token_ids, received, tile_words, lse,
    keys, send, start, width)` writes lse, keys and send; `merge(received, stops, slots,
    positions, chosen, requested, counts, token_ids, lse, out, vocab_size, top_k)` writes out.
    To a compiler every write is opaque and no op returns a tensor, so the exchanges (eager
    collectives on the same buffers) stay between them and the logits are read in order.
    """

    statistics: Callable[..., None]
    candidates: Callable[..., None]
    merge: Callable[..., None]


_OPERATORS: VocabParallelOperators | None = None


def _no_result(*arguments) -> None:  # a fake op's only effect is its opaque writes
    return None


def vocab_parallel_operators() -> VocabParallelOperators:
    """`torch.ops.helios.vp_logprob_{statistics,candidates,merge}`, registered on first use.

    Only `TritonVocabParallelLogprobReducer` calls them (tensor parallelism on CUDA).
    """
    global _OPERATORS
    if _OPERATORS is None:
        declared = (
            ("statistics", launches.statistics, ("stats", "send")),
            ("candidates", launches.candidates, ("lse", "keys", "send")),
            ("merge", launches.merge, ("out",)),
        )
        operators = {}
        for name, steps, writes in declared:
            operator = torch.library.custom_op(
                f"helios::vp_logprob_{name}", steps, mutates_args=writes
            )
            operator.register_fake(_no_result)
            operators[name] = operator
        _OPERATORS = VocabParallelOperators(**operators)
    return _OPERATORS
