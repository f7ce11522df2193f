"""Constrained lanes of the torch executor: one matcher per slot, token masks per target row."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from adapters.grammar.llguidance_compiler import LlguidanceCompiler, LlguidanceMatcher
from domain.step import SlotWork


@dataclass(eq=False)
class _Lane:
    """A slot's matcher at one epoch; it has accepted the first `generated` output tokens."""

    epoch: int
    matcher: LlguidanceMatcher
    generated: int = 0


@dataclass(frozen=True)
class RowMasks:
    """Allowed-token bits for some target rows of a step: `rows` int64 [M] indexes the step's
    sampled rows, `bitmask` int32 [M, ceil(V / 32)] holds bit t % 32 of word t // 32 per row."""

    rows: torch.Tensor
    bitmask: torch.Tensor


class GrammarLanes:
    """Keeps each constrained slot's matcher in step with the executor and computes its masks.

    A matcher is keyed by slot and epoch: a new epoch (admission or readmission after a
    preemption), or a chunk at position 0, starts a fresh one, which then accepts the generated
    tokens the lane feeds again. `start` computes a step's masks on a worker thread while the
    model runs (llguidance releases the GIL); `commit` advances matchers by what the records
    emitted. A speculative lane's row j is masked under the state after its first j drafts,
    which are accepted for the purpose and rolled back; rows after a draft the grammar forbids
    get no mask, as they never emit (verification rejects that draft at its own, masked, row).
    """

    def __init__(self, compiler: LlguidanceCompiler, device: torch.device) -> None:
        self._compiler = compiler
        self._device = device
        self._lanes: dict[int, _Lane] = {}
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-masks")

    def start(
        self,
        works: Sequence[SlotWork],
        sampling: Sequence[SlotWork],
        drafts: Sequence[tuple[int, ...]],
        first_rows: Sequence[int],
    ) -> Future[RowMasks] | None:
        """Schedules the masks of a step whose sampling lanes have these drafts and first rows;
        None when no lane is constrained (unconstrained steps pay nothing)."""
        if not any(work.grammar is not None for work in works):
            return None
        return self._worker.submit(self._masks, works, sampling, drafts, first_rows)

    def commit(self, work: SlotWork, emitted: Sequence[int]) -> None:
        """Advances the lane's matcher by the tokens its record emitted."""
        lane = self._lanes.get(work.slot)
        if work.grammar is None or lane is None or not emitted:
            return
        if not lane.matcher.accept(emitted):
            raise RuntimeError(
                f"slot {work.slot}: the grammar refused emitted tokens {list(emitted)}: "
                f"{lane.matcher.error}"
            )
        lane.generated += len(emitted)

    def _masks(
        self,
        works: Sequence[SlotWork],
        sampling: Sequence[SlotWork],
        drafts: Sequence[tuple[int, ...]],
        first_rows: Sequence[int],
    ) -> RowMasks:
        for work in works:
            if work.grammar is not None:
                self._catch_up(work)
        constrained = [
            (work, lane_drafts, first)
            for work, lane_drafts, first in zip(sampling, drafts, first_rows, strict=True)
            if work.grammar is not None
        ]
        width = self._compiler.vocab_size
        # int32 [rows at most, ceil(V / 32)]: one row per target row of a constrained lane.
        bitmask = torch.zeros(
            (sum(1 + len(d) for _, d, _ in constrained), (width + 31) // 32), dtype=torch.int32
        )
        rows: list[int] = []
        eos = self._compiler.eos_token_ids
        for work, lane_drafts, first in constrained:
            matcher = self._lanes[work.slot].matcher
            accepted = 0
            for offset in range(len(lane_drafts) + 1):
                matcher.fill_bitmask(bitmask[len(rows)].data_ptr())
                rows.append(first + offset)
                # Nothing after a forbidden draft, or after EOS (which ends the lane), emits.
                draft = lane_drafts[offset] if offset < len(lane_drafts) else None
                if draft is None or draft in eos or not _allows(bitmask[len(rows) - 1], draft):
                    break
                matcher.accept((draft,))
                accepted += 1
            matcher.rollback(accepted)
        return RowMasks(
            torch.tensor(rows, dtype=torch.int64).to(self._device),
            bitmask[: len(rows)].to(self._device),
        )

    def _catch_up(self, work: SlotWork) -> None:
        """Starts the slot's matcher at a new epoch, then accepts the tokens from the grammar's
        start on (`SlotWork.constrained_from`: after the reasoning when the output began with
        it) that the lane feeds and it has not yet seen (a readmitted sequence re-feeds its
        outputs)."""
        lane = self._lanes.get(work.slot)
        # A chunk at position 0 begins a sequence's life in the slot, whatever its epoch says:
        # another engine over this executor counts epochs afresh. So does a lane that has fed
        # nothing the grammar walks yet (a grammar that starts after the reasoning first
        # appears on such a lane, mid-life, where a stale matcher may share its epoch).
        fresh = work.start_position == 0 or work.first_emitted_position <= work.constrained_from
        if lane is None or lane.epoch != work.epoch or fresh:
            assert work.grammar is not None
            matcher = self._compiler.compile(work.grammar).matcher()
            lane = self._lanes[work.slot] = _Lane(work.epoch, matcher)
        fed = work.token_ids[: len(work.token_ids) - len(work.drafts)]
        unseen = fed[max(0, work.constrained_from + lane.generated - work.start_position) :]
        if unseen:
            if not lane.matcher.accept(unseen):
                raise RuntimeError(f"slot {work.slot}: the grammar refused fed output {unseen}")
            lane.generated += len(unseen)


def _allows(row: torch.Tensor, token_id: int) -> bool:
    return bool(int(row[token_id >> 5]) >> (token_id & 31) & 1)
