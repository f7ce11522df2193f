"""The type of the JSON objects presentation builds for the HTTP adapter to serialize."""

from __future__ import annotations

from typing import Any, TypeAlias

# Values are JSON: str, int, float, bool, None, lists and objects of those.
JsonObject: TypeAlias = dict[str, Any]

# Python's `repr` writes a float in fixed notation from 1e-4 up to 1e16, in exponent form
# outside (`1e-07`, `1e+16`); every JSON encoder writes the same shortest digits, but not all
# spell the exponent form alike (msgspec writes `1e-7`).
REPR_FIXED_FROM = 1e-4
REPR_FIXED_BELOW = 1e16


class ReprFloat(float):
    """A float whose JSON text must be `repr`'s exponent form, which fast encoders spell
    otherwise: an encoder that writes floats its own way writes these as `repr` does.
    `json.dumps` writes every float as `repr` does, these included."""

    __slots__ = ()


class JsonText(bytes):
    """JSON already written, as UTF-8 bytes (an adapter's fast path): the HTTP adapter's JSON
    encoder (`adapters/http/wire_json`) writes it as it stands; no other encoder knows it."""

    __slots__ = ()


def wire_float(value: float) -> float:
    """`value` as a float every encoder writes as `json.dumps` does: marked as a `ReprFloat`
    where `repr` takes exponent form (nonzero magnitudes below 1e-4 or from 1e16)."""
    if value and not REPR_FIXED_FROM <= abs(value) < REPR_FIXED_BELOW:
        return ReprFloat(value)
    return value
