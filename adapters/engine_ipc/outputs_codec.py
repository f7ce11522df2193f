"""A batch of outputs as plain tuples for the engine socket, and back.

Pickle writes a slotted frozen dataclass through `copyreg` in Python, about 8 us a delta with
its entry, position and token objects (64 deltas a step at 64 streams: half a millisecond of
the engine process's GIL a step, and as much again to load in the API process); the same
delta as tuples of ints, floats and strings pickles in C in under a microsecond. Deltas, the
hot item, travel as tuples; prompt scores and request ends, once a request each, as objects.
A position read from a frame sends its alternatives as the frame's bytes (`packed`), one bytes
object where the two tuples were 40 numbers at K=20.
"""

from __future__ import annotations

from collections.abc import Sequence

from domain.emission.outputs import ChoiceDelta, LogprobEntry, PromptScores, RequestEnd
from domain.logprobs.values import PositionLogprobs, TokenLogprob

Output = ChoiceDelta | PromptScores | RequestEnd
# (request_id, index, text, token_ids, finish_reason, stop_reason, entries, text_offsets),
# entries as (chosen ID, chosen logprob, alternative IDs, alternative logprobs, text offset),
# or with the packed alternatives and None in place of the two tuples
_Entry = tuple[int, float, tuple[int, ...] | bytes, tuple[float, ...] | None, int]
_Ids = tuple[int, ...]
_Delta = tuple[str, int, str, _Ids, str | None, str | int | None, tuple[_Entry, ...], _Ids]


def encode_outputs(batch: Sequence[tuple[str, Output]]) -> tuple[list[_Delta], list[tuple]]:
    """The batch as (deltas as tuples, other items with their request IDs and places)."""
    deltas: list[_Delta] = []
    others: list[tuple[int, str, Output]] = []
    for place, (request_id, item) in enumerate(batch):
        if type(item) is ChoiceDelta:
            entries = tuple(map(_entry, item.logprobs))
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


def _entry(entry: LogprobEntry) -> _Entry:
    position = entry.position
    chosen, packed = position.chosen, position.packed
    if packed is not None:
        return (chosen.token_id, chosen.logprob, packed, None, entry.text_offset)
    return (
        chosen.token_id,
        chosen.logprob,
        position.alternative_ids,
        position.alternative_logprobs,
        entry.text_offset,
    )


def _position(
    chosen: TokenLogprob, ids: tuple[int, ...] | bytes, values: tuple[float, ...] | None
) -> PositionLogprobs:
    if isinstance(ids, bytes):
        return PositionLogprobs.of_packed(chosen, ids)
    return PositionLogprobs.of_columns(chosen, ids, values or ())


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
                    LogprobEntry(_position(TokenLogprob(chosen, value), ids, values), offset)
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
