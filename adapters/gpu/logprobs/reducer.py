"""The logprob reducer interface: one inputs value, the protocol, the checks every reducer runs."""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch

from domain.logprobs.values import MAX_SELECTED_IDS, NATURAL_TOP_K

LOGIT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class ReductionInputs(NamedTuple):
    """One reduction's tensors. Row r reports into out[slots[r], positions[r]] when
    requested[slots[r]] is nonzero; R is the number of logits rows."""

    logits: torch.Tensor  # [R, >= V] float32/bfloat16/float16: raw rows (or a shard), only read
    slots: torch.Tensor  # [R] int64: the physical slot of each row
    positions: torch.Tensor  # [R] int64: each row's index among its record's emitted tokens
    chosen: torch.Tensor  # [R] int64: the emitted token ID of each row
    requested: torch.Tensor  # [capacity] int32: nonzero for slots requesting logprobs
    counts: torch.Tensor | None  # [capacity] int32: selected IDs per slot; None: no ID inputs
    token_ids: torch.Tensor | None  # [capacity, 128] int32: selected IDs; None with counts
    out: torch.Tensor  # [capacity, T, >= 2 + 2 * pairs] int32: one completion_logprobs frame


class LogprobReducer(Protocol):
    """Writes the packed logprobs of requesting rows into one `completion_logprobs` frame.

    Invariants every implementation keeps, word for word equal to `ReferenceLogprobReducer`:
    - rows whose slot has a zero flag are neither read nor written, and logits are only read;
    - a requesting row gets its chosen pair, then its slot's selected IDs in caller order when
      the slot's count is positive, else the K natural alternatives (ID -1, bits 0 past a
      vocabulary smaller than K); words past those pairs keep their contents;
    - an ID outside the real vocabulary reports NaN bits instead of reading a padded lane.
    """

    def reserve(self, capacity: int, device: torch.device | str) -> None:
        """Sizes any workspace for calls of up to `capacity` rows, so that neither serving nor a
        graph capture allocates; a no-op for a reducer that keeps none."""
        ...

    def reduce(self, inputs: ReductionInputs) -> None:
        """Writes each requesting row's chosen pair and alternative pairs into `inputs.out`."""
        ...


def check_sizes(vocab_size: int, top_k: int) -> None:
    """A reducer needs a real vocabulary and 1 <= K <= NATURAL_TOP_K natural alternatives."""
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    if not 1 <= top_k <= NATURAL_TOP_K:
        raise ValueError(f"top_k must be in 1..{NATURAL_TOP_K}, got {top_k}")


def check_inputs(inputs: ReductionInputs, width: int, top_k: int, rows: str = "logits") -> None:
    """Raises unless the inputs have the forms every reducer reads and writes.

    `width` is how many logits lanes the reducer reads (the vocabulary, or a rank's shard);
    `rows` names the logits in the message.
    """
    logits, out = inputs.logits, inputs.out
    if logits.dtype not in LOGIT_DTYPES:
        raise TypeError(f"logits must be float32, bfloat16 or float16, got {logits.dtype}")
    if logits.dim() != 2 or logits.shape[1] < width:
        raise ValueError(f"{rows} must be [rows, >= {width}], got {tuple(logits.shape)}")
    if (inputs.counts is None) != (inputs.token_ids is None):
        raise ValueError("counts and token_ids are declared together or not at all")
    needed = MAX_SELECTED_IDS if inputs.counts is not None else top_k
    if out.dtype != torch.int32 or out.dim() != 3 or out.shape[2] < 2 + 2 * needed:
        raise ValueError(
            f"out must be int32 [capacity, T, >= {2 + 2 * needed}], got "
            f"{out.dtype} {tuple(out.shape)}"
        )
    if not out.is_contiguous():
        raise ValueError("out must be contiguous: it is written through its flat view")
