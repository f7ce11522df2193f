"""Per-slot token statistics the sampler's penalties need, kept on the device between steps."""

from __future__ import annotations

import torch

from domain.engine.step import SlotWork


class PenaltyState:
    """Counts of generated tokens and a mask of prompt tokens for each slot.

    Allocated on first use, so servers whose requests never ask for penalties pay no memory.
    A lane that restarts at position 0 (admission or readmission) clears its slot first.
    Columns are the token IDs [start, stop) of `lanes` (a rank's vocabulary shard; default the
    whole vocabulary); tokens outside them are another rank's to count.
    """

    def __init__(
        self,
        capacity: int,
        vocab_size: int,
        device: torch.device,
        lanes: tuple[int, int] | None = None,
    ) -> None:
        self._capacity = capacity
        self._lanes = lanes if lanes is not None else (0, vocab_size)
        self._vocab_size = self._lanes[1] - self._lanes[0]
        self._device = device
        # (output counts int32 [capacity, V], prompt mask bool [capacity, V]) once allocated.
        self._tables: tuple[torch.Tensor, torch.Tensor] | None = None

    def observe(self, work: SlotWork) -> None:
        """Records the tokens a lane feeds this step, if its request uses penalties; drafts
        count only once accepted (`accept`)."""
        if not work.sampling.params.uses_penalties:
            return
        if self._tables is None:
            shape = (self._capacity, self._vocab_size)
            self._tables = (
                torch.zeros(shape, dtype=torch.int32, device=self._device),
                torch.zeros(shape, dtype=torch.bool, device=self._device),
            )
        output_counts, prompt_mask = self._tables
        if work.start_position == 0:
            output_counts[work.slot].zero_()
            prompt_mask[work.slot].zero_()
        fed = work.token_ids[: len(work.token_ids) - len(work.drafts)]
        prompt_part = max(0, min(work.prompt_len - work.start_position, len(fed)))
        prompt_ids = self._local(fed[:prompt_part])
        if prompt_ids:
            ids = torch.tensor(prompt_ids, dtype=torch.int64, device=self._device)
            prompt_mask[work.slot, ids] = True
        self._count(work.slot, fed[prompt_part:])

    def accept(self, work: SlotWork, accepted: tuple[int, ...]) -> None:
        """Counts a round's accepted drafts: they are in the cache and never fed again."""
        if work.sampling.params.uses_penalties:
            self._count(work.slot, accepted)

    def _local(self, token_ids: tuple[int, ...]) -> list[int]:
        start, stop = self._lanes
        return [token_id - start for token_id in token_ids if start <= token_id < stop]

    def _count(self, slot: int, generated: tuple[int, ...]) -> None:
        local = self._local(generated)
        if self._tables is None or not local:
            return
        ids = torch.tensor(local, dtype=torch.int64, device=self._device)
        self._tables[0][slot].index_add_(0, ids, torch.ones_like(ids, dtype=torch.int32))

    def rows(self, slots: list[int]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if self._tables is None:
            return None, None
        index = torch.tensor(slots, dtype=torch.int64, device=self._device)
        output_counts, prompt_mask = self._tables
        return output_counts[index], prompt_mask[index]
