"""Which emitted tokens of a record get logprob entries, and whether the payload agrees."""

from __future__ import annotations

from domain.logprobs import PositionLogprobs
from domain.records import CompletionRecord


class LogprobDataError(Exception):
    """The frame's payload for a requesting lane is missing or disagrees with its record."""


def record_positions(
    record: CompletionRecord, positions: tuple[PositionLogprobs, ...] | None
) -> tuple[PositionLogprobs | None, ...]:
    """One entry per emitted token, None for forced tokens (they have no logprob entry).

    The record decides what is meaningful: a requesting lane must carry exactly one decoded
    position per emitted token, each naming the emitted token as its chosen ID.
    """
    if positions is None:
        raise LogprobDataError(
            f"slot {record.slot}: logprobs were requested but the frame carries none"
        )
    if len(positions) != len(record.tokens):
        raise LogprobDataError(
            f"slot {record.slot}: {len(positions)} logprob positions for "
            f"{len(record.tokens)} emitted tokens"
        )
    entries: list[PositionLogprobs | None] = []
    for index, (token_id, position) in enumerate(zip(record.tokens, positions, strict=True)):
        if record.is_forced(index):
            entries.append(None)
            continue
        if position.chosen.token_id != token_id:
            raise LogprobDataError(
                f"slot {record.slot}: logprob payload names token {position.chosen.token_id} "
                f"where the record emitted {token_id}"
            )
        entries.append(position)
    return tuple(entries)
