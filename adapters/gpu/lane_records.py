"""The completion record each kind of lane commits: prompt, sampled, forced and retired."""

from __future__ import annotations

from collections.abc import Sequence

from domain.contract.records import CompletionRecord, Finish, Role
from domain.engine.commit import forced_round
from domain.engine.step import SlotWork


def prompt_record(work: SlotWork) -> CompletionRecord:
    """A prefill chunk that samples nothing: it emits nothing and leaves the lane at its end."""
    return CompletionRecord(
        slot=work.slot, epoch=work.epoch, role=Role.PROMPT, first_position=work.end_position
    )


def sampled_record(
    work: SlotWork,
    emitted: Sequence[int],
    finish: Finish,
    *,
    drafts_offered: int = 0,
    drafts_accepted: int = 0,
) -> CompletionRecord:
    """A sampling lane's record of what the commit rule emitted (a verifying lane's role is
    SPECULATIVE, with its drafts offered and accepted)."""
    return _emitting(
        work,
        tuple(emitted),
        finish,
        role=Role.SPECULATIVE if work.speculation is not None else Role.SAMPLE,
        drafts_offered=drafts_offered,
        drafts_accepted=drafts_accepted,
    )


def forced_record(work: SlotWork) -> CompletionRecord:
    """A forced lane's record: its token under the commit rule, marked in the forced mask."""
    emitted, finish, mask = forced_round(work)
    return _emitting(work, emitted, finish, role=Role.SAMPLE, forced_mask=mask)


def retired_record(work: SlotWork) -> CompletionRecord:
    """A retired lane's record: it emits nothing and finishes with ERROR."""
    return CompletionRecord(
        slot=work.slot,
        epoch=work.epoch,
        role=Role.INVALID,
        first_position=work.end_position,
        finish=Finish.ERROR,
    )


def _emitting(
    work: SlotWork, emitted: tuple[int, ...], finish: Finish, *, role: Role, **counts: int
) -> CompletionRecord:
    first = work.first_emitted_position
    return CompletionRecord(
        slot=work.slot,
        epoch=work.epoch,
        role=role,
        tokens=emitted,
        first_position=first,
        finish=finish,
        generated_total=first - work.prompt_len + len(emitted),
        **counts,
    )
