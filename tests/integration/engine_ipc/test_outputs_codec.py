"""The engine socket's outputs codec gives back every item it was given, in order."""

from __future__ import annotations

import math
import pickle
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.engine_ipc.outputs_codec import decode_outputs, encode_outputs
from domain.emission.outputs import ChoiceDelta, LogprobEntry, PromptScores, RequestEnd, Usage
from domain.logprobs.prompt_scores import PromptScore
from domain.logprobs.values import PositionLogprobs, TokenLogprob

_values = st.floats(max_value=0.0) | st.just(math.nan) | st.just(-math.inf)
_pairs = st.lists(st.tuples(st.integers(0, 200_000), _values), max_size=20)


@st.composite
def _entries(draw: st.DrawFn) -> LogprobEntry:
    chosen = TokenLogprob(draw(st.integers(0, 200_000)), draw(_values))
    pairs = draw(_pairs)
    return LogprobEntry(
        PositionLogprobs(chosen, [TokenLogprob(i, v) for i, v in pairs]), draw(st.integers(0, 9))
    )


_deltas = st.builds(
    ChoiceDelta,
    index=st.integers(0, 3),
    text=st.text(max_size=8),
    token_ids=st.lists(st.integers(0, 200_000), max_size=3).map(tuple),
    finish_reason=st.sampled_from([None, "stop", "length", "abort"]),
    stop_reason=st.sampled_from([None, "###", 7]),
    logprobs=st.lists(_entries(), max_size=3).map(tuple),
    text_offsets=st.lists(st.integers(0, 50), max_size=3).map(tuple),
)
_others = st.sampled_from(
    [
        PromptScores(1, (PromptScore(5, -1.5, 2, (TokenLogprob(4, -0.25),)),)),
        RequestEnd(Usage(3, 2, 1)),
        RequestEnd(Usage(3, 0), error="the grammar failed", error_param="response_format"),
    ]
)


def _same(left: object, right: object) -> bool:
    """Equality in which NaN equals NaN (a NaN logprob must travel as NaN): `repr` writes
    every field of the value objects, and each float's shortest round-trip digits."""
    return repr(left) == repr(right)


@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), _deltas | _others), max_size=12))
def test_a_batch_travels_through_the_codec_and_its_pickle_unchanged(batch: list) -> None:
    travelled = decode_outputs(pickle.loads(pickle.dumps(encode_outputs(batch))))

    assert _same(travelled, batch)
    assert [type(item) for _, item in travelled] == [type(item) for _, item in batch]


def test_a_delta_pickles_as_plain_values_and_no_domain_object() -> None:
    entry = LogprobEntry(PositionLogprobs(TokenLogprob(1, -0.5), [TokenLogprob(2, -1.0)]), 0)
    encoded = encode_outputs([("r", ChoiceDelta(0, "x", (1,), logprobs=(entry,)))])

    assert b"domain." not in pickle.dumps(encoded)


def test_positions_refuse_columns_of_two_lengths() -> None:
    with pytest.raises(ValueError, match="2 alternative IDs but 1 values"):
        PositionLogprobs.of_columns(TokenLogprob(1, -0.5), (2, 3), (-1.0,))


def test_a_position_read_from_a_frame_travels_as_its_bytes() -> None:
    pairs = struct.pack("<ifif", 2, -1.0, 3, -1.5)
    position = PositionLogprobs.of_packed(TokenLogprob(1, -0.5), pairs)
    delta = ChoiceDelta(0, "x", (1,), logprobs=(LogprobEntry(position, 0),))

    ((_, travelled),) = decode_outputs(pickle.loads(pickle.dumps(encode_outputs([("r", delta)]))))

    assert travelled.logprobs[0].position.packed == pairs
    assert travelled == delta
