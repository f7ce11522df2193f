"""Constrained lanes of the torch executor: one matcher per slot, token masks per target row."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from domain.engine.step import SlotWork
from domain.structured.catch_up import grammar_catch_up
from ports.grammar import MaskingCompiler, MaskingGrammar, MaskingMatcher


@dataclass(eq=False)
class _Lane:
    """A slot's matcher at one epoch; it has accepted the first `generated` output tokens.

    The lane holds its compiled grammar, so that the compiler keeps finding it while the lane
    lives (a readmission after a preemption never recompiles it)."""

    epoch: int
    matcher: MaskingMatcher
    grammar: MaskingGrammar | None = None
    generated: int = 0


@dataclass(frozen=True)
class RowMasks:
    """Allowed-token bits for some target rows of a step: `rows` int64 [M] indexes the step's
    sampled rows, `bitmask` int32 [M, ceil(V / 32)] holds bit t % 32 of word t // 32 per row.

    `failed` maps the slot of each lane whose grammar broke while its masks were computed to
    that lane's own message; such a lane has no rows here, and the executor retires it.
    """

    rows: torch.Tensor
    bitmask: torch.Tensor
    failed: dict[int, str] = field(default_factory=dict)


class _Broke(Exception):
    """A lane's grammar broke (an llguidance limit, a matcher error) with this detail."""


class GrammarLanes:
    """Keeps each constrained slot's matcher in step with the executor and computes its masks.

    A matcher is keyed by slot and epoch: a new epoch (admission or readmission after a
    preemption), or a chunk at position 0, starts a fresh one, which then accepts the generated
    tokens the lane feeds again. `start` computes a step's masks on a worker thread while the
    model runs (llguidance releases the GIL); `commit` advances matchers by what the records
    emitted. A speculative lane's row j is masked under the state after its first j drafts,
    which are accepted for the purpose and rolled back; rows after a draft the grammar forbids
    get no mask, as they never emit (verification rejects that draft at its own, masked, row).

    A grammar can break while its request runs (llguidance refuses a token when a parser row
    outgrows its limit, say). That is the lane's own failure: `start`'s masks list the lane in
    `failed` and `commit` returns its message, both in words about that lane only (the first
    line of llguidance's error, never its dump of the parser state); the lane's matcher is
    dropped and the other lanes go on. A speculative draft the matcher cannot take breaks the
    lane too, even if verification would have rejected it: llguidance's error is sticky (no
    rollback recovers the matcher), and the lane depends only on its own drafts.
    """

    def __init__(self, compiler: MaskingCompiler, device: torch.device) -> None:
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

    def commit(self, work: SlotWork, emitted: Sequence[int]) -> str | None:
        """Advances the lane's matcher by the tokens its record emitted; when the grammar
        breaks instead, drops the lane and returns the message its request fails with."""
        lane = self._lanes.get(work.slot)
        if work.grammar is None or lane is None or not emitted:
            return None
        if not lane.matcher.accept(emitted):
            self.retire(work.slot)
            return _message(work, _Broke(lane.matcher.error))
        lane.generated += len(emitted)
        return None

    def retire(self, slot: int) -> None:
        """Forgets the slot's matcher: its lane failed (here, or on another rank)."""
        self._lanes.pop(slot, None)

    def _masks(
        self,
        works: Sequence[SlotWork],
        sampling: Sequence[SlotWork],
        drafts: Sequence[tuple[int, ...]],
        first_rows: Sequence[int],
    ) -> RowMasks:
        failed: dict[int, str] = {}
        for work in works:
            if work.grammar is not None:
                try:
                    self._catch_up(work)
                except Exception as error:  # noqa: BLE001 - the lane's own failure
                    failed[work.slot] = self._fail(work, error)
        constrained = [
            (work, lane_drafts, first)
            for work, lane_drafts, first in zip(sampling, drafts, first_rows, strict=True)
            if work.grammar is not None and work.slot not in failed
        ]
        width = self._compiler.vocab_size
        # int32 [rows at most, ceil(V / 32)]: one row per target row of a constrained lane.
        bitmask = torch.zeros(
            (sum(1 + len(d) for _, d, _ in constrained), (width + 31) // 32), dtype=torch.int32
        )
        rows: list[int] = []
        for work, lane_drafts, first in constrained:
            try:
                # A lane that breaks part-way leaves rows that the next lane overwrites.
                rows += self._lane_masks(work, lane_drafts, first, bitmask[len(rows) :])
            except Exception as error:  # noqa: BLE001 - the lane's own failure
                failed[work.slot] = self._fail(work, error)
        return RowMasks(
            torch.tensor(rows, dtype=torch.int64).to(self._device),
            bitmask[: len(rows)].to(self._device),
            failed,
        )

    def _lane_masks(
        self, work: SlotWork, drafts: tuple[int, ...], first: int, bitmask: torch.Tensor
    ) -> list[int]:
        """Fills the lane's mask rows from the top of `bitmask`; returns their target rows."""
        matcher = self._lanes[work.slot].matcher
        eos = self._compiler.eos_token_ids
        rows: list[int] = []
        accepted = 0
        for offset in range(len(drafts) + 1):
            matcher.fill_bitmask(bitmask[len(rows)].data_ptr())
            if matcher.error:  # llguidance reports a broken matcher only by its error
                raise _Broke(matcher.error)
            rows.append(first + offset)
            # Nothing after a forbidden draft, or after EOS (which ends the lane), emits.
            draft = drafts[offset] if offset < len(drafts) else None
            if draft is None or draft in eos or not _allows(bitmask[len(rows) - 1], draft):
                break
            if not matcher.accept((draft,)):
                raise _Broke(matcher.error)
            accepted += 1
        matcher.rollback(accepted)
        return rows

    def _fail(self, work: SlotWork, error: Exception) -> str:
        self.retire(work.slot)
        return _message(work, error)

    def _catch_up(self, work: SlotWork) -> None:
        """Brings the slot's matcher in step with the lane by the shared catch-up rule
        (`domain.structured.catch_up`): a fresh one when it restarts, then the fed tokens it has
        not yet accepted."""
        lane = self._lanes.get(work.slot)
        catch_up = grammar_catch_up(
            work,
            None if lane is None else lane.epoch,
            0 if lane is None else lane.generated,
        )
        if lane is None or catch_up.restart:
            assert work.grammar is not None
            compiled = self._compiler.compile(work.grammar.spec)
            lane = self._lanes[work.slot] = _Lane(work.epoch, compiled.matcher(), compiled)
        if catch_up.unseen:
            if not lane.matcher.accept(catch_up.unseen):
                raise _Broke(lane.matcher.error)
            lane.generated += len(catch_up.unseen)


def _allows(row: torch.Tensor, token_id: int) -> bool:
    return bool(int(row[token_id >> 5]) >> (token_id & 31) & 1)


def _message(work: SlotWork, error: Exception) -> str:
    """What the lane's request is told: which of its constraints broke, and the first line of
    why (llguidance appends the parser's state and the grammar after it, which stay out)."""
    assert work.grammar is not None
    detail = getattr(error, "message", None) or str(error)
    lines = [line.strip() for line in detail.strip().splitlines() if line.strip()]
    why = lines[0] if lines else type(error).__name__
    return f"the output constraint ({work.grammar.spec.kind.value}) broke while generating: {why}"
