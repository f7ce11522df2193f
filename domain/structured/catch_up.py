"""The grammar catch-up: where a constrained lane's matcher starts, and what it must consume."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from domain.structured.constraint import GrammarLane


class ConstrainedWork(Protocol):
    """What the catch-up reads of a lane (the engine's `SlotWork`)."""

    @property
    def epoch(self) -> int: ...
    @property
    def token_ids(self) -> tuple[int, ...]: ...
    @property
    def start_position(self) -> int: ...
    @property
    def drafts(self) -> tuple[int, ...]: ...
    @property
    def first_emitted_position(self) -> int: ...
    @property
    def grammar(self) -> GrammarLane | None: ...


@dataclass(frozen=True, slots=True)
class CatchUp:
    """What a lane's matcher does before its step is masked: start afresh (`restart`), then
    accept `unseen`, the fed tokens its grammar walks that it has not accepted yet."""

    restart: bool
    unseen: tuple[int, ...]


def grammar_catch_up(work: ConstrainedWork, epoch: int | None, generated: int) -> CatchUp:
    """The catch-up of a constrained lane whose matcher, if any, was started at `epoch` (None:
    no matcher) and has accepted the first `generated` tokens from the grammar's start on.

    A fresh matcher starts on a new epoch (admission, or readmission after a preemption), on a
    chunk at position 0 (a sequence's life in the slot begins there, whatever its epoch says:
    another engine over the same executor counts epochs afresh), and on a lane that has fed
    nothing its grammar walks yet (a grammar that starts after the reasoning first appears
    mid-life, where a stale matcher may share the epoch). A readmitted sequence re-feeds its
    outputs; the matcher accepts only what it has not seen, and never the lane's drafts, which
    verification decides.
    """
    if work.grammar is None:
        raise ValueError("only a constrained lane catches its matcher up")
    start = work.grammar.start
    restart = (
        epoch is None
        or epoch != work.epoch
        or work.start_position == 0
        or work.first_emitted_position <= start
    )
    seen = 0 if restart else generated
    fed = work.token_ids[: len(work.token_ids) - len(work.drafts)]
    return CatchUp(restart, fed[max(0, start + seen - work.start_position) :])
