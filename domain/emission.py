"""Which emitted tokens of a record get logprob entries, and whether the payload agrees."""

from __future__ import annotations

from collections.abc import Sequence

from domain.logprobs import PositionLogprobs
from domain.prompt_scores import PromptScore
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


def new_prompt_scores(
    prompt: Sequence[int],
    scored_rows: int,
    chunk_start: int,
    rows: Sequence[PromptScore | None] | None,
) -> tuple[PromptScore, ...]:
    """The scores of a scored lane's chunk not yet published, in position order.

    Row r of the prompt scores position r + 1; rows before `scored_rows` were published before
    a preemption and are skipped, the row at the prompt end has no score. Every other row must
    carry a score naming its prompt token.
    """
    if rows is None:
        raise LogprobDataError("a scored lane's frame carries no prompt scores")
    fresh = []
    for offset, score in enumerate(rows):
        row = chunk_start + offset
        if row < scored_rows or row >= len(prompt) - 1:
            continue
        if row != scored_rows + len(fresh):
            raise LogprobDataError(f"prompt row {row} arrives before row {scored_rows}")
        if score is None or score.token_id != prompt[row + 1]:
            named = "no score" if score is None else f"token {score.token_id}"
            raise LogprobDataError(
                f"prompt row {row} carries {named} where the prompt has token {prompt[row + 1]}"
            )
        fresh.append(score)
    return tuple(fresh)
