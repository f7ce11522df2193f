"""Prompt-scoring targets and the packed int32 prompt-logprob row, shared by device and host."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from domain.common.errors import LogprobDataError
from domain.logprobs.values import (
    NATURAL_TOP_K,
    NO_TOKEN,
    TokenLogprob,
    bits_to_float,
    unpack_pairs,
)

PROMPT_ROW_WORDS = 3 + 2 * NATURAL_TOP_K  # actual ID, bits, rank, then (ID, bits) pairs
INVALID_BITS = 0x7FC00000  # the quiet NaN an invalid row carries as its logprob


@dataclass(frozen=True, slots=True)
class PromptScore:
    """One scored prompt position: the actual token, its logprob and rank, and alternatives.

    `rank` is one plus the number of vocabulary values strictly greater than `logprob`.
    """

    token_id: int
    logprob: float
    rank: int
    alternatives: tuple[TokenLogprob, ...] = ()

    def __post_init__(self) -> None:
        if self.token_id < 0:
            raise ValueError(f"token_id must be non-negative, got {self.token_id}")
        if self.rank < 1:
            raise ValueError(f"rank must be at least 1, got {self.rank}")
        if len(self.alternatives) > NATURAL_TOP_K:
            raise ValueError(f"{len(self.alternatives)} alternatives exceed {NATURAL_TOP_K}")


def unpack_prompt_row(words: Sequence[int]) -> PromptScore | None:
    """The score a packed row carries, or None for an invalid row (actual ID -1).

    Alternatives stop at the first -1 ID (a vocabulary smaller than twenty). A row with a
    real ID but a rank below one is malformed and raises.
    """
    if len(words) != PROMPT_ROW_WORDS:
        raise ValueError(f"a prompt row has {PROMPT_ROW_WORDS} words, got {len(words)}")
    token_id, bits, rank = words[0], words[1], words[2]
    if token_id == NO_TOKEN:
        return None
    alternatives = unpack_pairs(words, 3, NATURAL_TOP_K)
    return PromptScore(token_id, bits_to_float(bits), rank, alternatives)


def prompt_targets(prompt: Sequence[int], chunk_start: int, chunk_len: int) -> list[int]:
    """Per row of a prefill chunk, the prompt token that row predicts, or -1 at the prompt end.

    Row j of the chunk starting at `chunk_start` scores prompt[chunk_start + j + 1].
    """
    if chunk_start < 0 or chunk_len < 0 or chunk_start + chunk_len > len(prompt):
        raise ValueError(
            f"chunk [{chunk_start}, {chunk_start + chunk_len}) is outside a prompt of "
            f"{len(prompt)} tokens"
        )
    end = len(prompt)
    return [
        prompt[position + 1] if position + 1 < end else NO_TOKEN
        for position in range(chunk_start, chunk_start + chunk_len)
    ]


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
    fresh: list[PromptScore] = []
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
