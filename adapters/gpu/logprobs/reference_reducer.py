"""The torch reference of the generation logprob reduction into the packed completion frame."""

from __future__ import annotations

from typing import NamedTuple

import torch

from adapters.gpu.logprobs.keys import key_token_ids, top_sort_keys
from adapters.gpu.logprobs.normalizer import log_normalizer
from adapters.gpu.logprobs.reducer import ReductionInputs, check_inputs, check_sizes
from domain.logprobs.values import MAX_SELECTED_IDS, NATURAL_TOP_K, NO_TOKEN


class _Reported(NamedTuple):
    """Requesting rows' FP32 logits `real` [rows, V] and their log normalizers `lse` [rows]."""

    real: torch.Tensor
    lse: torch.Tensor


class ReferenceLogprobReducer:
    """`LogprobReducer` from torch operations: the oracle every other reducer matches.

    The only host synchronization is choosing the requesting rows, whose count shapes the work;
    everything after it is shape-static, so no other device value reaches the host. It keeps
    no workspace, so `reserve` has nothing to size.
    """

    def __init__(self, vocab_size: int, top_k: int = NATURAL_TOP_K) -> None:
        check_sizes(vocab_size, top_k)
        self.vocab_size = vocab_size
        self.top_k = top_k

    def reserve(self, capacity: int, device: torch.device | str) -> None:
        """Nothing to size: every call allocates what its requesting rows need."""

    def reduce(self, inputs: ReductionInputs) -> None:
        """Writes each requesting row's chosen pair and alternative pairs to out[slot, position].

        `logits` [R, V_padded] are the raw rows before any sampling transform and are only read.
        Rows whose slot has a zero `requested` flag are neither read nor written. A slot with a
        positive count gets its first `count` IDs of `token_ids` in caller order; otherwise it
        gets the K natural alternatives (ID -1, bits 0 past a vocabulary smaller than K). Words
        past those pairs keep their contents. Selected or chosen IDs outside the real vocabulary
        report NaN instead of reading a padded lane.
        """
        check_inputs(inputs, self.vocab_size, self.top_k)
        logits, slots, positions, chosen, requested, counts, token_ids, out = inputs
        wanted = requested.index_select(0, slots) != 0
        rows = torch.nonzero(wanted).squeeze(1)
        if rows.numel() == 0:
            return
        slots, positions = slots.index_select(0, rows), positions.index_select(0, rows)
        chosen = chosen.index_select(0, rows).to(torch.int64)
        reported = self._reported(logits, rows)
        natural_ids, natural_bits = self._natural(reported)
        pair_ids, pair_bits, live = natural_ids, natural_bits, None
        if counts is not None and token_ids is not None:
            pair_ids, pair_bits, live = self._with_selected(
                reported, slots, counts, token_ids, natural_ids, natural_bits
            )
        chosen_bits = self._read(reported, chosen, torch.ones_like(chosen, dtype=torch.bool))
        write_positions(out, slots, positions, chosen, chosen_bits, pair_ids, pair_bits, live)

    def _reported(self, logits: torch.Tensor, rows: torch.Tensor) -> _Reported:
        """The requesting rows' FP32 logits over the real vocabulary and their lse: a reported
        value is `logit - lse`, one FP32 subtraction, made only where it is read.

        PERF: on the CPU the rows were two fresh copies a step (the caller's selection and this
        one's), 1.5 MB each at 8 rows of 49,152, and their page faults cost more than the
        reduction (docs/performance.md). When every row requests, the logits are read where
        they lie, and the compiled top keys subtract as they read."""
        real = logits[:, : self.vocab_size]
        if rows.numel() != real.shape[0]:
            real = real.index_select(0, rows)
        real = real.to(torch.float32)
        return _Reported(real, log_normalizer(real))

    def _natural(self, reported: _Reported) -> tuple[torch.Tensor, torch.Tensor]:
        """The top-K (ID, bits) pairs by sort key, padded with (-1, 0) past the vocabulary."""
        real, lse = reported
        top_keys = top_sort_keys(real, min(self.top_k, self.vocab_size), lse)
        top_ids = key_token_ids(top_keys)
        # Bits come from the values themselves, so a reported -0.0 keeps its sign.
        top_bits = (real.gather(1, top_ids) - lse[:, None]).view(torch.int32)
        missing = self.top_k - top_ids.shape[1]
        if missing:
            top_ids = torch.nn.functional.pad(top_ids, (0, missing), value=NO_TOKEN)
            top_bits = torch.nn.functional.pad(top_bits, (0, missing), value=0)
        return top_ids.to(torch.int32), top_bits

    def _with_selected(
        self,
        reported: _Reported,
        slots: torch.Tensor,
        counts: torch.Tensor,
        token_ids: torch.Tensor,
        natural_ids: torch.Tensor,
        natural_bits: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per row: the selected pairs when its count is positive, else the natural ones.

        Returns the [rows, 128] pair IDs and bits and which of those pairs are to be written.
        """
        count = counts.index_select(0, slots).to(torch.int64).clamp(max=MAX_SELECTED_IDS)
        selects = count > 0
        index = torch.arange(MAX_SELECTED_IDS, device=slots.device)
        # IDs past a slot's uploaded prefix are stale, so they are never used as read indices.
        in_prefix = index[None, :] < count[:, None]
        selected_ids = token_ids.index_select(0, slots).to(torch.int64)
        selected_bits = self._read(reported, selected_ids, in_prefix)
        padding = MAX_SELECTED_IDS - self.top_k
        natural_ids = torch.nn.functional.pad(natural_ids, (0, padding), value=NO_TOKEN)
        natural_bits = torch.nn.functional.pad(natural_bits, (0, padding), value=0)
        pair_ids = torch.where(selects[:, None], selected_ids.to(torch.int32), natural_ids)
        pair_bits = torch.where(selects[:, None], selected_bits, natural_bits)
        live = torch.where(selects[:, None], in_prefix, index[None, :] < self.top_k)
        return pair_ids, pair_bits, live

    def _read(self, reported: _Reported, ids: torch.Tensor, wanted: torch.Tensor) -> torch.Tensor:
        """int32 bits of the value at [row, id] where wanted; NaN bits for an ID outside the
        vocabulary."""
        real, lse = reported
        inside = (ids >= 0) & (ids < self.vocab_size)
        safe = torch.where(wanted & inside, ids, torch.zeros_like(ids))
        squeeze = ids.dim() == 1
        read = real.gather(1, safe[:, None] if squeeze else safe) - lse[:, None]
        read = read.squeeze(1) if squeeze else read
        return torch.where(inside, read, torch.full_like(read, float("nan"))).view(torch.int32)


def write_positions(
    out: torch.Tensor,
    slots: torch.Tensor,
    positions: torch.Tensor,
    chosen: torch.Tensor,
    chosen_bits: torch.Tensor,
    pair_ids: torch.Tensor,
    pair_bits: torch.Tensor,
    live: torch.Tensor | None,
) -> None:
    """Scatters the payload into the flat frame, touching only the words that carry data.

    A pair that must stay unwritten is aimed at pair 0 with pair 0's own words (pair 0 is
    always written), so the scatter keeps a static shape and needs no mask on the host.
    """
    pairs = pair_ids.shape[1]
    index = torch.arange(pairs, device=out.device).expand(pair_ids.shape[0], pairs)
    if live is not None:
        index = torch.where(live, index, torch.zeros_like(index))
        pair_ids = torch.where(live, pair_ids, pair_ids[:, :1])
        pair_bits = torch.where(live, pair_bits, pair_bits[:, :1])
    words = torch.cat(
        [
            chosen.to(torch.int32)[:, None],
            chosen_bits[:, None],
            torch.stack([pair_ids, pair_bits], dim=2).flatten(1),
        ],
        dim=1,
    )
    offsets = torch.cat(
        [
            torch.arange(2, device=out.device).expand(index.shape[0], 2),
            torch.stack([2 + 2 * index, 3 + 2 * index], dim=2).flatten(1),
        ],
        dim=1,
    )
    base = (slots * out.shape[1] + positions) * out.shape[2]
    out.view(-1).scatter_(0, (base[:, None] + offsets).flatten(), words.flatten())
