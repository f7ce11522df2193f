"""The scored-prefill storage: packed prompt-logprob frames and the row targets that feed them."""

from __future__ import annotations

from collections.abc import Callable

import torch

from adapters.gpu.scoring.prompt_scorer import PROJECTION_ROWS, PromptScorer
from adapters.gpu.scoring.prompt_scorer_vp import VocabParallelPromptScorer
from domain.logprobs.prompt_scores import (
    INVALID_BITS,
    PROMPT_ROW_WORDS,
    PromptScore,
    unpack_prompt_row,
)
from domain.logprobs.values import NATURAL_TOP_K, NO_TOKEN


class PromptScoreFrames:
    """Owns `prompt_logprobs` int32[2, C, 43] and `prompt_target_tokens` int32[C] (C: the
    largest scored capacity) and scores a scored plan's rows into its submission frame.

    A plan of n rows runs at the smallest capacity holding n; only that frame's first
    `capacity` rows are written (rows past n as invalid rows), and the frame is decoded per
    lane on read. On CUDA the read copies into preallocated pinned host frames once the
    event recorded after the producing submission has completed.
    """

    @staticmethod
    def fixed_bytes(capacities: tuple[int, ...], vocab_size: int) -> int:
        """Device bytes the flag allocates up front: both frames, the targets and the pooled
        [64, vocab] FP32 logit block."""
        rows = capacities[-1]
        frames = 2 * rows * PROMPT_ROW_WORDS * 4
        return frames + rows * 4 + PROJECTION_ROWS * vocab_size * 4

    def __init__(
        self,
        capacities: tuple[int, ...],
        vocab_size: int,
        device: torch.device,
        scorer: PromptScorer | VocabParallelPromptScorer | None = None,
    ) -> None:
        if not capacities:
            raise ValueError("prompt scoring needs at least one scored capacity")
        self.capacities = capacities
        rows = capacities[-1]
        self.prompt_logprobs = torch.zeros(
            (2, rows, PROMPT_ROW_WORDS), dtype=torch.int32, device=device
        )
        self.prompt_target_tokens = torch.full((rows,), NO_TOKEN, dtype=torch.int32, device=device)
        # A tensor-parallel rank scores through its shard (`VocabParallelPromptScorer`).
        self._scorer = scorer if scorer is not None else PromptScorer(vocab_size)
        if isinstance(self._scorer, PromptScorer):
            self._scorer.reserve(device)
        self._invalid_row = torch.tensor(
            [NO_TOKEN, INVALID_BITS, 0] + [NO_TOKEN, 0] * NATURAL_TOP_K,
            dtype=torch.int32,
            device=device,
        )
        self._lanes: list[tuple[int, ...]] = [(), ()]
        # On the CPU the frames already live in host memory: no staging copy, no events.
        self._host = self._produced = None
        if device.type == "cuda":
            self._host = torch.empty(
                (2, rows, PROMPT_ROW_WORDS), dtype=torch.int32, pin_memory=True
            )
            self._produced = [torch.cuda.Event(), torch.cuda.Event()]

    def capacity_for(self, rows: int) -> int:
        for capacity in self.capacities:
            if rows <= capacity:
                return capacity
        raise ValueError(f"{rows} scored rows exceed the largest capacity {self.capacities[-1]}")

    def score(
        self,
        frame: int,
        hidden: torch.Tensor,
        targets: list[int],
        lanes: list[int],
        project: Callable[[torch.Tensor], torch.Tensor],
    ) -> None:
        """Scores hidden rows [n, H] against `targets` (one per row); `lanes` are row counts."""
        rows = len(targets)
        if rows != hidden.shape[0] or sum(lanes) != rows:
            raise ValueError(f"{rows} targets, {hidden.shape[0]} hidden rows, lanes {lanes}")
        capacity = self.capacity_for(rows)
        self.prompt_target_tokens[:rows].copy_(torch.tensor(targets, dtype=torch.int32))
        self.prompt_target_tokens[rows:capacity].fill_(NO_TOKEN)
        out = self.prompt_logprobs[frame]
        self._scorer.score(hidden, self.prompt_target_tokens[:rows], project, out)
        out[rows:capacity] = self._invalid_row
        self._lanes[frame] = tuple(lanes)
        if self._produced is not None:
            self._produced[frame].record()

    def read(self, frame: int) -> tuple[tuple[PromptScore | None, ...], ...]:
        """Each lane's decoded rows, in plan order; empty when the frame scored nothing."""
        lanes, self._lanes[frame] = self._lanes[frame], ()
        if not lanes:
            return ()
        rows = sum(lanes)
        host = self.prompt_logprobs[frame, :rows]
        if self._host is not None and self._produced is not None:
            self._produced[frame].synchronize()
            host = self._host[frame, :rows].copy_(host)
        words = host.tolist()
        decoded = []
        start = 0
        for count in lanes:
            decoded.append(tuple(unpack_prompt_row(row) for row in words[start : start + count]))
            start += count
        return tuple(decoded)
