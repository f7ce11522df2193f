"""Chat logprobs written from token templates are the bytes presentation's objects encode to."""

from __future__ import annotations

import math
import struct

from hypothesis import given
from hypothesis import strategies as st

from adapters.http.logprob_json import LogprobJson, native_module
from adapters.http.wire_json import encode
from domain.emission.outputs import LogprobEntry
from domain.logprobs.values import (
    NATURAL_TOP_K,
    LogprobOptions,
    PositionLogprobs,
    TokenLogprob,
    bits_to_float,
)
from domain.presentation.logprobs import TokenRendering, chat_logprobs

# Names that JSON escapes, non-ASCII text, a lone continuation byte (a replacement character),
# an empty token, two IDs (7 and 8) that decode to the same name, and `%` signs, which the
# templates' formatting must leave as they are.
PIECES = [
    b"Hello",
    b' "quoted"',
    b"back\\slash",
    b"\n\t\r\x00\x1f\x7f",
    "caf\u00e9 \u2028 \U0001f600".encode(),
    b"\x80",
    b"",
    b" same",
    b" same",
    b"</script>",
    b"100%",
    b"%b%%s",
]
SPECIAL_VALUES = [
    -math.inf,
    math.nan,
    -0.0,
    0.0,
    -1e-05,
    -9.999999747378752e-05,
    -0.0001,
    -9999.0,
    -12000.5,
    -1.1920928955078125e-07,
]

token_ids = st.integers(0, len(PIECES) - 1)
logprob_values = st.one_of(
    st.integers(-(2**31), 2**31 - 1).map(bits_to_float),
    st.sampled_from(SPECIAL_VALUES),
)
# Where the wire's text is repr's (the floor up to -1e-4, both ends included): the positions
# the C module writes, most of what a model gives.
in_range_values = st.one_of(
    st.floats(-9999.0, -(2.0**-13), width=32),
    st.sampled_from([-9999.0, -0.0001, -0.00010000000474974513, -1.0]),
)


@st.composite
def entries(draw, values=logprob_values):
    """Positions with up to K alternatives, a chosen token that may lead them, any FP32 value."""
    found = []
    for offset in draw(st.lists(st.integers(0, 400), max_size=4)):
        chosen = TokenLogprob(draw(token_ids), draw(values))
        count = draw(st.integers(0, NATURAL_TOP_K))
        alternatives = [TokenLogprob(draw(token_ids), draw(values)) for _ in range(count)]
        if alternatives and draw(st.booleans()):
            alternatives[0] = chosen
        found.append(LogprobEntry(PositionLogprobs(chosen, alternatives), offset))
    return found


options = st.one_of(
    st.integers(0, NATURAL_TOP_K).map(lambda k: LogprobOptions(top_k=k)),
    st.lists(token_ids, min_size=1, max_size=3).map(
        lambda ids: LogprobOptions(token_ids=tuple(ids))
    ),
)


def renderings() -> list[TokenRendering]:
    return [
        TokenRendering(PIECES.__getitem__),
        TokenRendering(PIECES.__getitem__, as_token_ids=True),
    ]


# Each rendering with the C module (when built) and with the Python path alone.
WRITERS = [
    (rendering, LogprobJson(rendering, native=native))
    for rendering in renderings()
    for native in (True, False)
]


@given(entries(), options)
def test_chat_logprobs_from_fragments_are_the_encoded_objects_byte_for_byte(found, asked):
    for rendering, writer in WRITERS:
        written = writer.chat(found, asked)
        assert encode(written) == encode(chat_logprobs(found, asked, rendering))
        assert encode({"logprobs": written}) == encode(
            {"logprobs": chat_logprobs(found, asked, rendering)}
        )


def test_a_token_with_percent_signs_keeps_them_in_its_name_and_bytes():
    chosen = TokenLogprob(11, -0.5)
    position = PositionLogprobs(chosen, [chosen, TokenLogprob(10, -1.25)])
    rendering, writer = WRITERS[0]

    written = encode(writer.chat([LogprobEntry(position, 0)], LogprobOptions(top_k=2)))

    assert written == (
        b'{"content":[{"token":"%b%%s","logprob":-0.5,"bytes":[37,98,37,37,115],'
        b'"top_logprobs":[{"token":"%b%%s","logprob":-0.5,"bytes":[37,98,37,37,115]},'
        b'{"token":"100%","logprob":-1.25,"bytes":[49,48,48,37]}]}]}'
    )
    assert written == encode(
        chat_logprobs([LogprobEntry(position, 0)], LogprobOptions(2), rendering)
    )


def test_make_builds_the_c_module_that_writes_positions():
    assert native_module() is not None, "`make native` builds adapters/http/native"


def packed(found: list[LogprobEntry]) -> list[LogprobEntry]:
    """The entries as the engine socket delivers positions read from a frame: alternatives as
    the frame's (int32 ID, FP32 bits) pairs (values rounded to FP32, as a frame holds them)."""
    return [
        LogprobEntry(
            PositionLogprobs.of_packed(
                entry.position.chosen,
                b"".join(
                    struct.pack("<if", token_id, value)
                    for token_id, value in zip(
                        entry.position.alternative_ids,
                        entry.position.alternative_logprobs,
                        strict=True,
                    )
                ),
            ),
            entry.text_offset,
        )
        for entry in found
    ]


# Any FP32 values, and values all in repr's range: the positions the C module writes.
@given(st.one_of(entries(), entries(in_range_values)), options)
def test_packed_positions_are_the_encoded_objects_byte_for_byte(found, asked):
    found = packed(found)
    for rendering, writer in WRITERS:
        written = writer.chat(found, asked)
        assert encode(written) == encode(chat_logprobs(found, asked, rendering))


def test_the_c_module_writes_a_packed_position_and_declines_a_value_outside_repr_s_range():
    module = native_module()
    assert module is not None
    rendering = TokenRendering(PIECES.__getitem__)
    writer = LogprobJson(rendering, native=False)
    memo = writer._chat
    for token_id in range(len(PIECES)):
        memo[token_id]  # noqa: B018 -- fills the memo (and its list by ID) as the Python path does
    chosen = TokenLogprob(1, -0.5)
    pairs = struct.pack("<ifif", 4, -0.25, 10, -3.0000001192092896)
    entry = LogprobEntry(PositionLogprobs.of_packed(chosen, pairs), 0)

    written = module.packed_position(memo.by_id, 1, -0.5, pairs, 2)
    assert b'{"content":[%b]}' % written == writer.chat([entry], LogprobOptions(top_k=2))
    shown_one = module.packed_position(memo.by_id, 1, -0.5, pairs, 1)
    assert b'{"content":[%b]}' % shown_one == writer.chat([entry], LogprobOptions(top_k=1))
    for value in (-1e-05, -0.0, -math.inf, math.nan, -12000.5):
        outside = struct.pack("<ifif", 4, -0.25, 10, value)
        assert module.packed_position(memo.by_id, 1, -0.5, outside, 2) is None
        assert module.packed_position(memo.by_id, 1, value, pairs, 2) is None
    # A chosen value that is not an FP32 value's widening has no text there either.
    assert module.packed_position(memo.by_id, 1, -0.1, pairs, 2) is None
    # A token without a template yet, and a count past the pairs.
    assert module.packed_position(memo.by_id, len(memo.by_id), -0.5, pairs, 2) is None
    assert module.packed_position(memo.by_id, 1, -0.5, pairs, 3) is None


def fp32_bits(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0]


def test_the_c_module_writes_repr_s_text_for_the_fp32_values_at_both_ends_and_in_between():
    """Every FP32 value of [-9999, -1e-4] was compared once (`float_texts_disagree(0,
    0x7F7FFFFF)`, about two minutes): here the ends of the range, the powers of two and
    windows of each binade."""
    module = native_module()
    assert module is not None
    windows = [
        (fp32_bits(1e-4) - 50_000, fp32_bits(1e-4) + 50_000),
        (fp32_bits(9999.0) - 100_000, fp32_bits(9999.0) + 10),
    ]
    for exponent in range(113, 141):  # the binades from 2^-14 to 2^13
        first = exponent << 23
        windows += [(first - 2, first + 2), (first + 3_000_000, first + 3_020_000)]
    for first, last in windows:
        assert module.float_texts_disagree(first, last) is None, (first, last)
    assert module.float_text(-0.1) is None  # not an FP32 value's widening
    assert module.float_text(-1e-05) is None and module.float_text(-12000.5) is None
    for value in (-0.5, -9999.0, -0.00010000000474974513, -0.10000000149011612, -1234.5):
        assert module.float_text(value) == repr(value).encode()
