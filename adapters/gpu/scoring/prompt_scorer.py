"""Scores prompt rows against their next prompt token, 64 projected rows at a time."""

from __future__ import annotations

from collections.abc import Callable

import torch

from adapters.gpu.logprobs.keys import greater_counts, key_token_ids, top_sort_keys
from adapters.gpu.logprobs.normalizer import log_normalizer
from domain.logprobs.prompt_scores import INVALID_BITS, PROMPT_ROW_WORDS
from domain.logprobs.values import NATURAL_TOP_K, NO_TOKEN

# Hidden rows projected through the LM head at once: the only logit matrix scoring holds is
# [PROJECTION_ROWS, vocabulary], whatever the chunk length.
PROJECTION_ROWS = 64


class BlockScorer:
    """Scores prompt rows against their next prompt token, PROJECTION_ROWS hidden rows at a time.

    Each block's logits land in one pooled [PROJECTION_ROWS, width] FP32 block that every row
    block reuses, so no more than one block of logits ever exists beyond what `project` itself
    returns. Subclasses turn a block into packed rows (`_block_of`, `_rows`).
    """

    def __init__(self, width: int, lanes: str) -> None:
        self._width = width
        self._lane_name = lanes  # what `project`'s lanes are, named in its errors
        self._block: torch.Tensor | None = None

    def score(
        self,
        hidden: torch.Tensor,
        targets: torch.Tensor,
        project: Callable[[torch.Tensor], torch.Tensor],
        out: torch.Tensor,
    ) -> None:
        """Fills out[:C] from final-normed `hidden` [C, H] and int32 `targets` [C].

        `project` maps hidden rows to float32 logits [rows, >= width]; lanes past the width
        are ignored. Each row gets its target's ID, FP32 logprob bits and rank, then the twenty
        best (ID, bits) pairs by the generation ordering. A row whose target is outside the
        real vocabulary (-1 at the prompt end) gets ID -1, NaN bits, rank 0 and alternative
        IDs -1. Rows of `out` past C keep their contents.
        """
        check_score_inputs(hidden, targets, out)
        self._begin(hidden.shape[0])
        for start in range(0, hidden.shape[0], PROJECTION_ROWS):
            stop = min(start + PROJECTION_ROWS, hidden.shape[0])
            logits = self._checked(project(hidden[start:stop]), stop - start)
            block = self._block_of(logits, self._pooled(logits.device)[: stop - start])
            out[start:stop].copy_(self._rows(block, targets[start:stop].to(torch.int64)))

    def reserve(self, device: torch.device) -> None:
        """Allocates the pooled logit block now, at start-up, rather than on the first score."""
        self._pooled(device)

    def _pooled(self, device: torch.device) -> torch.Tensor:
        if self._block is None or self._block.device != device:
            self._block = torch.empty(
                PROJECTION_ROWS, self._width, dtype=torch.float32, device=device
            )
        return self._block

    def _checked(self, logits: torch.Tensor, rows: int) -> torch.Tensor:
        """`project`'s first `width` lanes, after checking its float32 [rows, >= width] form."""
        if logits.dtype != torch.float32 or logits.dim() != 2:
            raise TypeError(
                f"project must return float32 [rows, {self._lane_name}], got {logits.dtype}"
            )
        if logits.shape[0] != rows or logits.shape[1] < self._width:
            raise ValueError(
                f"{self._who()}project returned {tuple(logits.shape)}, "
                f"expected [{rows}, >= {self._width}]"
            )
        return logits[:, : self._width]

    def _who(self) -> str:
        """Whose `project` failed, leading its shape error ("rank 1 " under tensor parallelism)."""
        return ""

    def _begin(self, rows: int) -> None:
        """Called once per `score` with its row count, before any block."""

    def _block_of(self, logits: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """What `_rows` reads of one block's checked logits, written into `pooled`."""
        raise NotImplementedError

    def _rows(self, block: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The packed int32 rows [rows, PROMPT_ROW_WORDS] of one block."""
        raise NotImplementedError


class PromptScorer(BlockScorer):
    """Writes packed prompt-logprob rows with the same normalization as generation logprobs."""

    def __init__(self, vocab_size: int) -> None:
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be positive, got {vocab_size}")
        super().__init__(vocab_size, "V")
        self.vocab_size = vocab_size

    def _block_of(self, logits: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """FP32 logit - lse over the real vocabulary, written into `pooled` in one pass."""
        normalizer = log_normalizer(logits)
        return torch.sub(logits, normalizer[:, None], out=pooled)

    def _rows(self, values: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The packed int32 rows [rows, PROMPT_ROW_WORDS] of one block's reported values."""
        valid = (targets >= 0) & (targets < self.vocab_size)
        safe = torch.where(valid, targets, torch.zeros_like(targets))
        actual = values.gather(1, safe[:, None])
        # Equal reported values (including ties made by subtracting lse) never count as greater.
        rank = greater_counts(values, actual[:, 0]).add_(1)
        pair_ids, pair_bits = self._alternatives(values)
        bits = actual.squeeze(1).view(torch.int32)
        return pack_prompt_rows(valid, targets, bits, rank, pair_ids, pair_bits)

    def _alternatives(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The best twenty (ID, bits) pairs by sort key, (-1, 0) past a smaller vocabulary."""
        k = min(NATURAL_TOP_K, self.vocab_size)
        keys = top_sort_keys(values, k)
        ids = key_token_ids(keys)
        # Bits are read back from the values, so a reported -0.0 keeps its sign.
        bits = values.gather(1, ids).view(torch.int32)
        missing = NATURAL_TOP_K - k
        ids = ids.to(torch.int32)
        if missing:
            ids = torch.nn.functional.pad(ids, (0, missing), value=NO_TOKEN)
            bits = torch.nn.functional.pad(bits, (0, missing), value=0)
        return ids, bits


def check_score_inputs(hidden: torch.Tensor, targets: torch.Tensor, out: torch.Tensor) -> None:
    """`hidden` is [C, H], `targets` int32 [C] and `out` an int32 packed-row buffer of >= C rows."""
    if hidden.dim() != 2:
        raise ValueError(f"hidden must be [rows, hidden], got {tuple(hidden.shape)}")
    count = hidden.shape[0]
    if targets.dtype != torch.int32 or tuple(targets.shape) != (count,):
        raise ValueError(
            f"targets must be int32 [{count}], got {targets.dtype} {tuple(targets.shape)}"
        )
    if out.dtype != torch.int32 or out.dim() != 2 or out.shape[1] != PROMPT_ROW_WORDS:
        raise ValueError(
            f"out must be int32 [rows, {PROMPT_ROW_WORDS}], got {out.dtype} {tuple(out.shape)}"
        )
    if out.shape[0] < count:
        raise ValueError(f"out holds {out.shape[0]} rows, {count} are scored")


def pack_prompt_rows(
    valid: torch.Tensor,
    targets: torch.Tensor,
    bits: torch.Tensor,
    rank: torch.Tensor,
    pair_ids: torch.Tensor,
    pair_bits: torch.Tensor,
) -> torch.Tensor:
    """The int32 rows [n, PROMPT_ROW_WORDS]; rows not `valid` get the invalid row's words.

    `bits` [n] and `rank` [n] are int32, `pair_ids` and `pair_bits` int32 [n, 20].
    """
    invalid = ~valid
    ids = torch.where(valid, targets, NO_TOKEN).to(torch.int32)
    bits = bits.masked_fill(invalid, INVALID_BITS)
    rank = rank.masked_fill(invalid, 0)
    pair_ids = pair_ids.masked_fill(invalid[:, None], NO_TOKEN)
    pair_bits = pair_bits.masked_fill(invalid[:, None], 0)
    pairs = torch.stack([pair_ids, pair_bits], dim=2).flatten(1)
    return torch.cat([ids[:, None], bits[:, None], rank[:, None], pairs], dim=1)
