"""The completion and chat JSON encoder writes what `json.dumps` writes, without whitespace."""

from __future__ import annotations

import json
import math

from hypothesis import given
from hypothesis import strategies as st

from adapters.http.wire_json import encode
from domain.common.wire import ReprFloat, wire_float
from domain.logprobs.values import LOGPROB_FLOOR, bits_to_float, float_to_bits, wire_logprob


def compact(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


EDGES = [
    LOGPROB_FLOOR,
    -9998.9990234375,
    -0.0,
    0.0,
    5e-324,
    -1.401298464324817e-45,  # the smallest FP32 magnitude
    -1.1920928955078125e-07,  # FP32 epsilon
    -5.960464477539063e-08,
    -9.999999747378752e-05,  # the FP32 value just below 1e-4
    -0.0001,
    -0.00010000000474974513,
    -1e-05,
    -3.4028234663852886e38,
    1e16,
    9999999999999998.0,
    -1e22,
    -math.inf,
]


def test_logprob_values_keep_the_text_json_dumps_gives_them_at_the_edges():
    for value in EDGES:
        wire = wire_logprob(value)
        assert encode(wire) == compact(wire), value
        assert encode([wire]) == compact([wire]), value
    assert encode(wire_logprob(-math.inf)) == b"-9999.0"
    assert encode(wire_logprob(-1.1920928955078125e-07)) == b"-1.1920928955078125e-07"
    assert encode(wire_logprob(-0.0)) == b"-0.0"


@given(st.integers(-(2**31), 2**31 - 1))
def test_every_widened_fp32_logprob_keeps_its_json_dumps_text(bits):
    value = bits_to_float(bits)
    if math.isnan(value):
        return  # values are NaN-free; NaN is checked apart
    wire = wire_logprob(value)

    assert encode({"v": wire}) == compact({"v": wire})
    assert float_to_bits(json.loads(encode(wire))) == float_to_bits(wire)


@given(st.floats(allow_nan=False))
def test_any_float_marked_by_wire_float_keeps_its_json_dumps_text(value):
    assert encode(wire_float(value)) == compact(value)


def test_a_non_finite_marked_value_is_spelled_as_json_dumps_spells_it():
    for value in (math.nan, math.inf, -math.inf):
        assert encode(ReprFloat(value)) == compact(value)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False).map(wire_float)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)


@given(json_values)
def test_objects_are_written_as_compact_json_dumps_writes_them(value):
    assert encode(value) == compact(value)
