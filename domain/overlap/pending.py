"""Planning ahead: the pending-token placeholder, when a step may be planned ahead, its fill-in."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from domain.contract.records import CompletionRecord

if TYPE_CHECKING:  # the engine plans with these rules: naming its types at run time is a cycle
    from domain.engine.sequence import Sequence
    from domain.engine.step import SlotWork, StepPlan

# What a lane planned ahead feeds at the position of the token its slot's submission in flight
# samples: only the executor, which ran that submission first, knows the token.
PENDING_TOKEN = -1
# What a placeholder becomes when the slot's previous submission emitted nothing (its lane was
# retired or its step failed): that request has ended, so the engine drops the lane's record.
ORPHAN_TOKEN = 0


def plans_ahead(sequence: Sequence) -> bool:
    """Whether a choice's next lane may be planned before its lane in flight is read: only a
    choice without per-token host state does. Speculation (how many drafts stand), a grammar
    (the next mask needs the matcher to have seen the token), the thinking budget (whether the
    next token is forced) and prompt scoring (its turn alternates with ordinary steps) each
    need the previous step's tokens on the host, so their steps run synchronously."""
    return (
        sequence.speculation is None
        and sequence.constraint is None
        and sequence.thinking is None
        and sequence.scoring is None
    )


def may_plan_ahead(running: Iterable[Sequence], waiting: Iterable[Sequence]) -> bool:
    """Whether the next step may be planned while one is in flight: every running choice plans
    ahead, and no waiting prompt is to be scored (scored steps take turns with ordinary ones,
    which only a synchronous plan gives them)."""
    return all(plans_ahead(s) for s in running) and not any(s.needs_scoring for s in waiting)


def feeding(work: SlotWork, token_ids: tuple[int, ...]) -> SlotWork:
    """`work` feeding `token_ids` instead (a filled-in placeholder), every other field the same.

    A fill-in of a lane without drafts keeps the number of tokens fed, and every check of
    `SlotWork` reads only that number and the drafts, so such a lane is copied without them:
    the checks were 3 of the 5 us a lane took on the overlapped worker's path before each step.
    Any other lane is built anew, checks and all.
    """
    if work.speculation is not None or len(token_ids) != len(work.token_ids):
        return dataclasses.replace(work, token_ids=token_ids)
    filled: SlotWork = object.__new__(type(work))
    for name in _kept_fields(type(work)):
        object.__setattr__(filled, name, getattr(work, name))
    object.__setattr__(filled, "token_ids", token_ids)
    return filled


def _kept_fields(lane_type: type) -> tuple[str, ...]:
    """The fields a fill-in copies: all but the tokens fed (read once per lane class)."""
    kept = _KEPT_FIELDS.get(lane_type)
    if kept is None:
        names = (f.name for f in dataclasses.fields(lane_type))
        kept = _KEPT_FIELDS[lane_type] = tuple(name for name in names if name != "token_ids")
    return kept


_KEPT_FIELDS: dict[type, tuple[str, ...]] = {}


def last_tokens(records: Iterable[CompletionRecord]) -> dict[tuple[int, int], int]:
    """By (slot, epoch), the last token each emitting record emitted: what the lane planned
    ahead of it feeds."""
    return {(r.slot, r.epoch): r.tokens[-1] for r in records if r.tokens}


def resolve_pending(plan: StepPlan, last: Mapping[tuple[int, int], int]) -> StepPlan:
    """The plan an executor runs: each placeholder replaced by the last token its slot emitted
    (at the lane's epoch) in the executor's previous submission, `last` holding those tokens
    (`last_tokens` of its records, or `late_commit.drawn_tokens` of a commit left for later)."""
    if not any(PENDING_TOKEN in work.token_ids for work in plan.works):
        return plan
    works = []
    for work in plan.works:
        fed = work.token_ids
        if PENDING_TOKEN in fed:
            token = last.get((work.slot, work.epoch), ORPHAN_TOKEN)
            # A decode lane feeds the placeholder alone.
            filled = (
                (token,)
                if len(fed) == 1
                else tuple(token if t == PENDING_TOKEN else t for t in fed)
            )
            work = feeding(work, filled)
        works.append(work)
    return dataclasses.replace(plan, works=tuple(works))
