"""Prompt scoring as a part of one choice: which prompt rows its lanes score and publish."""

from __future__ import annotations

from collections.abc import Sequence

from domain.logprobs.prompt_scores import PromptScore, new_prompt_scores, prompt_targets
from domain.logprobs.values import NO_TOKEN


class PromptScoring:
    """The choice that scores its request's prompt, and how many prompt rows (row r scores
    position r + 1) it has published; a preemption keeps the count, so nothing repeats."""

    def __init__(self, prompt: tuple[int, ...]) -> None:
        self._prompt = prompt
        self.scored_rows = 0

    @property
    def pending(self) -> bool:
        """Prompt rows remain unpublished; such a choice runs only in scored steps."""
        return self.scored_rows < len(self._prompt) - 1

    def targets(self, start: int, chunk: int) -> tuple[int, ...]:
        """A scored chunk's prompt targets, -1 for rows already published before a preemption."""
        targets = prompt_targets(self._prompt, start, chunk)
        return tuple(
            target if start + row >= self.scored_rows else NO_TOKEN
            for row, target in enumerate(targets)
        )

    def publish(
        self, chunk_end: int, rows: Sequence[PromptScore | None] | None
    ) -> tuple[int, tuple[PromptScore, ...]]:
        """The scores of a scored chunk ending at `chunk_end` (one row per fed token) not yet
        published (see `new_prompt_scores`), after the number of the first of them (row r
        scores position r + 1); they count as published now. Raises LogprobDataError for
        rows that break the contract."""
        first = self.scored_rows + 1
        chunk_start = chunk_end - (len(rows) if rows is not None else 0)
        fresh = new_prompt_scores(self._prompt, self.scored_rows, chunk_start, rows)
        self.scored_rows += len(fresh)
        return first, fresh
