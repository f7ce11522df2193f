"""A batch of outputs as plain tuples for the engine socket, and back.

Pickle writes a slotted frozen dataclass through `copyreg` in Python, about 8 us a delta with
its entry, position and token objects (64 deltas a step at 64 streams: half a millisecond of
the engine process's GIL a step, and as much again to load in the API process); the same
delta as tuples of ints, floats and strings pickles in C in under a microsecond. Deltas, the
hot item, travel as tuples; prompt scores and request ends, once a request each, as objects.
"""

from __future__ import annotations

from collections.abc import Sequence

from domain.emission.outputs import ChoiceDelta, LogprobEntry, PromptScores, RequestEnd
from domain.logprobs.values import PositionLogprobs, TokenLogprob

Output = ChoiceDelta | PromptScores | RequestEnd
# (request_id, index, text, token_ids, finish_reason, stop_reason, entries, text_offsets),
# entries as (chosen ID, chosen logprob, alternative IDs, alternative logprobs, text offset)
_Entry = tuple[int, float, tuple[int, ...], tuple[float, ...], int]
_Ids = tuple[int, ...]
_Delta = tuple[str, int, str, _Ids, str | None, str | int | None, tuple[_Entry, ...], _Ids]


def encode_outputs(batch: Sequence[tuple[str, Output]]) -> tuple[list[_Delta], list[tuple]]:
    """The batch as (deltas as tuples, other items with their request IDs and places)."""
    deltas: list[_Delta] = []
    others: list[tuple[int, str, Output]] = []
    for place, (request_id, item) in enumerate(batch):
        if type(item) is ChoiceDelta:
            entries = tuple(
                (
                    entry.position.chosen.token_id,
                    entry.position.chosen.logprob,
                    entry.position.alternative_ids,
                    entry.position.alternative_logprobs,
                    entry.text_offset,
                )
                for entry in item.logprobs
            )
            deltas.append(
                (
                    request_id,
                    item.index,
                    item.text,
                    item.token_ids,
                    item.finish_reason,
                    item.stop_reason,
                    entries,
                    item.text_offsets,
                )
            )
        else:
            others.append((place, request_id, item))
    return deltas, others


def decode_outputs(encoded: tuple[list[_Delta], list[tuple]]) -> list[tuple[str, Output]]:
    """The batch `encode_outputs` was given, in its order."""
    deltas, others = encoded
    batch: list[tuple[str, Output]] = [
        (
            request_id,
            ChoiceDelta(
                index,
                text,
                token_ids,
                finish,
                stop,
                tuple(
                    LogprobEntry(
                        PositionLogprobs.of_columns(TokenLogprob(chosen, value), ids, values),
                        offset,
                    )
                    for chosen, value, ids, values, offset in entries
                ),
                offsets,
            ),
        )
        for request_id, index, text, token_ids, finish, stop, entries, offsets in deltas
    ]
    for place, request_id, item in others:
        batch.insert(place, (request_id, item))
    return batch
