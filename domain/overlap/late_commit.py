"""Committing late: which submissions may launch the next one before their own commit."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # executors apply these rules to the engine's plans: naming them is a cycle
    from domain.engine.step import StepPlan


def commits_late(plan: StepPlan) -> bool:
    """Whether an executor may launch its next submission before it commits this one.

    Then the next launch must not depend on anything the commit decides, and every lane's
    record must follow from its draw alone: a lane that samples without drafts, a grammar or
    a forced token emits exactly the one token it drew (the commit rule only names why the
    request ends), and a lane that only feeds prompt tokens emits nothing. Drafts (how many
    stood), a grammar (the matcher takes the token before the next mask) and a forced token
    are decided or kept by the commit; a scored plan alternates with ordinary ones.
    """
    return not plan.scored and all(
        work.speculation is None and work.grammar is None and work.forced_token is None
        for work in plan.works
    )


def drawn_tokens(plan: StepPlan, drawn: Iterable[int]) -> dict[tuple[int, int], int]:
    """By (slot, epoch), the token each sampling lane of `plan` drew (`drawn`, in plan order),
    for a plan that `commits_late`: the last token its record will emit, which is what a
    lane planned ahead of it feeds (`pending.resolve_pending`)."""
    if not commits_late(plan):
        raise ValueError("only a plan whose records follow from its draws alone commits late")
    sampling = [work for work in plan.works if work.sample]
    return {(w.slot, w.epoch): token for w, token in zip(sampling, drawn, strict=True)}
