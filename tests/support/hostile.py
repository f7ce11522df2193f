"""Hypothesis strategies for hostile JSON values: huge integers, huge or fractional floats and
absurdly long strings, each as the literal sent on the wire plus a value a schema can judge."""

from __future__ import annotations

import json
from dataclasses import dataclass

from hypothesis import strategies as st

# The server's default body limit (8 MiB); above it the answer is 413.
MAX_BODY_BYTES = 8 << 20
# Every integer range of the contract ends below 10**20; beyond this many digits a literal is
# judged by a stand-in of the same sign, since Python cannot even print the literal's value.
_JUDGED_DIGITS = 30
_BOUNDARY_INTEGERS = (2**31, -(2**31) - 1, 2**63, -(2**63) - 1, 2**64)
_OVERFLOWING_FLOATS = ("1e400", "-1e400", "1.7976931348623157e308")


@dataclass(frozen=True)
class Hostile:
    """`literal` is the JSON text sent; `judged` is what JSON Schema validation sees."""

    literal: str
    judged: object

    def __repr__(self) -> str:
        shown = (
            self.literal
            if len(self.literal) <= 60
            else f"{self.literal[:40]}...<{len(self.literal)} chars>"
        )
        return f"Hostile({shown})"


def integer_literal(digits: int, lead: int = 1, negative: bool = False) -> Hostile:
    # Built as text: Python refuses to convert integers of more than 4300 digits to strings.
    literal = ("-" if negative else "") + str(lead) + "0" * (digits - 1)
    sign = -1 if negative else 1
    judged = sign * 10**_JUDGED_DIGITS if digits > _JUDGED_DIGITS else int(literal)
    return Hostile(literal, judged)


def huge_integers() -> st.SearchStrategy[Hostile]:
    """Integers past int32, past signed 64 bits, and of up to 100,000 digits."""
    built = st.builds(integer_literal, st.integers(11, 100_000), st.integers(1, 9), st.booleans())
    boundaries = st.sampled_from(_BOUNDARY_INTEGERS).map(lambda n: Hostile(str(n), n))
    return st.one_of(boundaries, built)


def huge_floats() -> st.SearchStrategy[Hostile]:
    """Floats from 1e19 up to and past the float range (JSON `1e400` reads as infinite)."""
    finite = st.floats(min_value=1e19, max_value=1.7e308).flatmap(
        lambda x: st.sampled_from((x, -x))
    )
    overflowing = st.sampled_from(_OVERFLOWING_FLOATS)
    return st.one_of(
        finite.map(float_literal),
        overflowing.map(lambda text: Hostile(text, json.loads(text))),
    )


def fractional_floats() -> st.SearchStrategy[Hostile]:
    """Finite floats that are not integers, such as 2.5 or -1e-300."""
    numbers = st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: not x.is_integer())
    return numbers.map(float_literal)


def float_literal(value: float) -> Hostile:
    return Hostile(repr(value), value)


def string_literal(text: str) -> Hostile:
    return Hostile(json.dumps(text), text)


def long_strings() -> st.SearchStrategy[Hostile]:
    """Valid Unicode strings of 257 to 200,000 characters (a body stays below the limit)."""
    characters = st.characters(exclude_categories=("Cs",))
    return st.builds(lambda c, n: string_literal(c * n), characters, st.integers(257, 200_000))
