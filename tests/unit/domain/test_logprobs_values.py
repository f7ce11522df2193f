"""Logprob values: FP32 bit storage, the alternative sort key and the packed position layout."""

from __future__ import annotations

import math
import struct

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from domain.common.wire import ReprFloat
from domain.logprobs.values import (
    FULL_POSITION_WORDS,
    LOGPROB_FLOOR,
    MAX_SELECTED_IDS,
    NATURAL_TOP_K,
    NO_TOKEN,
    LogprobOptions,
    PositionLogprobs,
    TokenLogprob,
    bits_to_float,
    float_to_bits,
    sort_key,
    unpack_position_bytes,
    wire_logprob,
    wire_logprobs,
)
from tests.support.packing import pack_position

fp32 = st.floats(width=32, allow_nan=False)
token_ids = st.integers(0, 2**31 - 1)
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)


def test_the_shared_limits_are_the_seed_s_k_and_selected_id_maximum() -> None:
    assert NATURAL_TOP_K == 20
    assert MAX_SELECTED_IDS == 128
    assert FULL_POSITION_WORDS == 258


def test_fp32_bits_are_stored_as_signed_int32_words() -> None:
    assert float_to_bits(1.0) == 0x3F800000
    assert float_to_bits(0.0) == 0
    assert float_to_bits(-0.0) == -(2**31)
    assert float_to_bits(-math.inf) == 0xFF800000 - 2**32
    assert math.isnan(bits_to_float(float_to_bits(math.nan)))


@given(fp32)
def test_fp32_values_survive_a_round_trip_through_their_bits(value) -> None:
    bits = float_to_bits(value)

    assert INT32[0] <= bits <= INT32[1]
    assert bits_to_float(bits) == value
    assert math.copysign(1.0, bits_to_float(bits)) == math.copysign(1.0, value)


@given(fp32, fp32, token_ids, token_ids)
def test_a_larger_value_ranks_first_whatever_the_token_ids(a, b, first_id, second_id) -> None:
    assume(a != b)
    larger, smaller = max(a, b), min(a, b)
    assert sort_key(larger, first_id) > sort_key(smaller, second_id)
    assert sort_key(larger, second_id) > sort_key(smaller, first_id)


@given(fp32, token_ids, token_ids)
def test_equal_values_rank_the_smaller_token_id_first(value, first_id, second_id) -> None:
    assume(first_id != second_id)
    smaller, larger = min(first_id, second_id), max(first_id, second_id)
    assert sort_key(value, smaller) > sort_key(value, larger)


@given(token_ids)
def test_negative_zero_shares_the_key_of_positive_zero(token_id) -> None:
    assert sort_key(-0.0, token_id) == sort_key(0.0, token_id)


@given(fp32, st.integers(0, 2**32 - 1))
def test_keys_fit_a_signed_int64_and_keep_the_inverted_id_in_the_low_word(value, token_id) -> None:
    key = sort_key(value, token_id)

    assert INT64[0] <= key <= INT64[1]
    assert key & 0xFFFFFFFF == 0xFFFFFFFF - token_id


def test_keys_order_a_mixed_list_like_value_then_id() -> None:
    entries = [(-math.inf, 0), (-1.5, 4), (-0.0, 9), (0.0, 3), (-1e-45, 1), (-1.5, 2), (-30.0, 0)]

    ranked = sorted(entries, key=lambda e: sort_key(*e), reverse=True)

    assert ranked == [
        (0.0, 3),
        (-0.0, 9),
        (-1e-45, 1),
        (-1.5, 2),
        (-1.5, 4),
        (-30.0, 0),
        (-math.inf, 0),
    ]


def _frame_bytes(*positions: list[int]) -> bytes:
    """Int32 words as a frame's host copy holds them: little-endian, back to back."""
    words = [word for position in positions for word in position]
    return struct.pack(f"<{len(words)}i", *words)


def unpack_position(words: list[int], pairs: int) -> PositionLogprobs:
    """A position read from its words laid out as frame bytes, at offset 0."""
    return unpack_position_bytes(_frame_bytes(words), 0, pairs)


alternatives = st.lists(st.builds(TokenLogprob, token_ids, fp32), max_size=MAX_SELECTED_IDS)


@given(st.builds(TokenLogprob, token_ids, fp32), alternatives, st.integers(0, 8))
def test_a_packed_position_unpacks_to_the_same_position(chosen, alternatives, spare) -> None:
    position = PositionLogprobs(chosen, tuple(alternatives))
    pairs = min(len(alternatives) + spare, MAX_SELECTED_IDS)

    words = pack_position(position, 2 + 2 * pairs)

    assert len(words) == 2 + 2 * pairs
    assert all(INT32[0] <= word <= INT32[1] for word in words)
    assert unpack_position(words, pairs) == position


def test_packing_pads_unused_pairs_with_minus_one_ids_and_zero_bits() -> None:
    position = PositionLogprobs(TokenLogprob(7, -0.5), (TokenLogprob(3, -0.25),))

    words = pack_position(position, 8)

    assert words == [7, float_to_bits(-0.5), 3, float_to_bits(-0.25), NO_TOKEN, 0, NO_TOKEN, 0]


def test_packing_more_alternatives_than_the_width_holds_is_rejected() -> None:
    extra = (TokenLogprob(2, -1.0), TokenLogprob(3, -2.0))
    position = PositionLogprobs(TokenLogprob(1, 0.0), extra)

    with pytest.raises(ValueError):
        pack_position(position, 4)


def test_unpacking_stops_at_the_first_minus_one_id_and_reads_no_further() -> None:
    words = [5, float_to_bits(-1.0), 9, float_to_bits(-2.0), NO_TOKEN, 0, 4, float_to_bits(-3.0)]

    position = unpack_position(words, 3)

    assert position == PositionLogprobs(TokenLogprob(5, -1.0), (TokenLogprob(9, -2.0),))


def test_unpacking_reads_only_the_requested_pairs() -> None:
    words = [5, float_to_bits(-1.0), 9, float_to_bits(-2.0), 4, float_to_bits(-3.0)]

    assert unpack_position(words, 1).alternatives == (TokenLogprob(9, -2.0),)
    assert unpack_position(words, 0).alternatives == ()


@given(st.builds(TokenLogprob, token_ids, fp32), alternatives, st.integers(0, 8), st.data())
def test_a_position_read_from_frame_bytes_equals_the_one_read_from_its_words(
    chosen, alternatives, spare, data
) -> None:
    position = PositionLogprobs(chosen, tuple(alternatives))
    width = min(len(alternatives) + spare, MAX_SELECTED_IDS)
    words = pack_position(position, 2 + 2 * width)
    pairs = data.draw(st.integers(0, width))
    before = [7] * (2 + 2 * width)  # another lane's position first: offsets are honoured

    read = unpack_position_bytes(_frame_bytes(before, words), 4 * len(before), pairs)

    expected = PositionLogprobs(chosen, tuple(alternatives[:pairs]))
    assert read == expected
    assert read.alternatives == expected.alternatives
    signs = [math.copysign(1.0, value) for value in read.alternative_logprobs]
    assert signs == [math.copysign(1.0, a.logprob) for a in expected.alternatives]


def test_a_position_read_from_bytes_keeps_minus_zero_tiny_and_minus_infinity_values() -> None:
    values = [-0.0, -1.401298464324817e-45, -1.1920928955078125e-07, -math.inf]
    chosen = TokenLogprob(3, -0.0)
    words = pack_position(
        PositionLogprobs(chosen, tuple(TokenLogprob(i, v) for i, v in enumerate(values))), 10
    )

    read = unpack_position_bytes(_frame_bytes(words), 0, 4)

    assert read.alternative_logprobs == tuple(values)
    assert [math.copysign(1.0, v) for v in read.alternative_logprobs] == [-1.0] * 4
    assert math.copysign(1.0, read.chosen.logprob) == -1.0


def test_a_position_read_from_bytes_stops_at_the_first_minus_one_id() -> None:
    words = [5, float_to_bits(-1.0), 9, float_to_bits(-2.0), NO_TOKEN, 0, 4, float_to_bits(-3.0)]

    read = unpack_position_bytes(_frame_bytes(words), 0, 3)

    assert read == PositionLogprobs(TokenLogprob(5, -1.0), (TokenLogprob(9, -2.0),))
    assert unpack_position_bytes(_frame_bytes(words), 0, 0).alternatives == ()


@pytest.mark.parametrize(
    ("value", "wire"),
    [(-math.inf, LOGPROB_FLOOR), (-1e6, LOGPROB_FLOOR), (-9999.0, -9999.0), (-0.25, -0.25)],
)
def test_json_logprobs_never_go_below_the_vllm_floor(value, wire) -> None:
    assert wire_logprob(value) == wire


@pytest.mark.parametrize(
    ("value", "marked"),
    [
        (-1.1920928955078125e-07, True),
        (-9.999999747378752e-05, True),
        (-1.401298464324817e-45, True),
        (-0.0001, False),
        (-0.25, False),
        (-0.0, False),
        (0.0, False),
        (-9999.0, False),
        (-math.inf, False),
    ],
)
def test_wire_values_repr_writes_in_exponent_form_are_marked_and_keep_their_value(
    value, marked
) -> None:
    wire = wire_logprob(value)

    assert isinstance(wire, ReprFloat) is marked
    assert math.copysign(1.0, wire) == math.copysign(1.0, max(value, LOGPROB_FLOOR))
    assert wire == max(value, LOGPROB_FLOOR)
    assert repr(float(wire)) == repr(max(value, LOGPROB_FLOOR))


@given(st.lists(st.integers(-(2**31), 2**31 - 1).map(bits_to_float), max_size=24))
def test_wire_values_of_a_list_are_those_of_each_value(values) -> None:
    values = [value for value in values if not math.isnan(value)]

    wire = wire_logprobs(values)

    expected = [wire_logprob(value) for value in values]
    assert wire == expected
    assert [type(value) for value in wire] == [type(value) for value in expected]
    assert [math.copysign(1.0, value) for value in wire] == [
        math.copysign(1.0, value) for value in expected
    ]


def test_options_carry_natural_pairs_or_the_selected_ids_instead() -> None:
    assert LogprobOptions().pairs == 0
    assert LogprobOptions(top_k=5).pairs == 5
    assert not LogprobOptions(top_k=5).selects
    selecting = LogprobOptions(top_k=5, token_ids=(8, 1, 3))
    assert selecting.selects
    assert selecting.pairs == 3


def test_a_read_position_keeps_its_alternatives_as_the_frame_s_bytes_until_asked() -> None:
    words = [7, float_to_bits(-0.5), 3, float_to_bits(-0.5), 9, float_to_bits(-2.0)]

    read = unpack_position(words, 2)

    assert read.packed == _frame_bytes(words[2:])
    assert read.alternative_ids == (3, 9)
    assert read.alternative_logprobs == (-0.5, -2.0)
    assert read == PositionLogprobs(
        TokenLogprob(7, -0.5), [TokenLogprob(3, -0.5), TokenLogprob(9, -2.0)]
    )
    assert hash(read) == hash(
        PositionLogprobs.of_columns(TokenLogprob(7, -0.5), (3, 9), (-0.5, -2.0))
    )


def test_a_value_whose_bits_read_as_minus_one_does_not_end_the_alternatives() -> None:
    # A NaN's bits 0xFFFFFFFF spell the -1 ID's bytes, but only a pair's first word is an ID.
    words = [7, float_to_bits(-0.5), 3, -1, 9, float_to_bits(-2.0), NO_TOKEN, 0, 4, 0]

    read = unpack_position(words, 4)

    assert read.alternative_ids == (3, 9)
    assert math.isnan(read.alternative_logprobs[0])
    assert read.packed == _frame_bytes(words[2:6])


def test_packed_alternatives_must_be_whole_pairs() -> None:
    with pytest.raises(ValueError, match="not whole"):
        PositionLogprobs.of_packed(TokenLogprob(1, -0.5), b"\x00" * 12)
