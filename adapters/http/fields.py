"""Typed reads of JSON request fields; a wrong type becomes a 400 naming the field."""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any, overload

from domain.common.errors import InvalidRequestError

# Python refuses to convert decimal literals of more than 4300 digits (a ValueError: once a 500).
# Longer ones saturate at ±10**400: outside every integer range of the API, and past float range,
# so a number field reads them as infinite, as it reads 10**400 itself.
_MAX_DIGITS = 400
_SATURATED = 10**_MAX_DIGITS


def _fail(name: str, kind: str, param: str | None = None) -> InvalidRequestError:
    return InvalidRequestError(f"`{name}` must be {kind}.", param=param or name)


def read_object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object", param=None)
    return body


def read_bool(body: dict, name: str, default: bool, *, within: str | None = None) -> bool:
    """`within` names the object that holds the field, which is then the error's `param`."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _fail(f"{within}.{name}" if within else name, "a boolean", within)
    return value


@overload
def read_int(body: dict, name: str, default: int) -> int: ...


@overload
def read_int(body: dict, name: str, default: None) -> int | None: ...


def read_int(body: dict, name: str, default: int | None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    number = as_int(value)
    if number is None:
        raise _fail(name, "an integer")
    return number


def read_float(body: dict, name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(name, "a number")
    return _to_float(value)


def read_str(body: dict, name: str, default: str | None) -> str | None:
    value = body.get(name)
    if value is None:
        return default
    if not is_text(value):
        raise _fail(name, "a string of valid Unicode")
    return value


def read_object_field(body: dict, name: str) -> dict | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _fail(name, "an object")
    return value


def read_object_list(body: dict, name: str) -> tuple[dict, ...] | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise _fail(name, "a list of objects")
    return tuple(value)


def read_int_list(body: dict, name: str) -> tuple[int, ...]:
    value = body.get(name)
    if value is None:
        return ()
    numbers = as_int_list(value)
    if numbers is None:
        raise _fail(name, "a list of integers")
    return tuple(numbers)


def read_stop(body: dict) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    if is_text(value):
        return (value,)
    if not isinstance(value, list) or not all(is_text(v) for v in value):
        raise _fail("stop", "a string or a list of strings, in valid Unicode")
    return tuple(value)


def read_logit_bias(body: dict) -> tuple[tuple[int, float], ...]:
    value = body.get("logit_bias")
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise _fail("logit_bias", "an object mapping token IDs to numbers")
    pairs = []
    for key, bias in value.items():
        # int() alone would also take " 7", "+7", "1_0" and non-ASCII digits as token IDs.
        if not (key.isascii() and key.isdigit()):
            raise _fail("logit_bias", "an object mapping token IDs to numbers")
        token_id = decimal_int(key)
        if isinstance(bias, bool) or not isinstance(bias, (int, float)):
            raise _fail("logit_bias", "an object mapping token IDs to numbers")
        pairs.append((token_id, _to_float(bias)))
    return tuple(pairs)


def decimal_int(literal: str) -> int:
    """The integer of an ASCII decimal literal (optionally signed), saturated at ±10**400."""
    if len(literal.lstrip("+-")) <= _MAX_DIGITS:
        return int(literal)
    return -_SATURATED if literal.startswith("-") else _SATURATED


def is_text(value: Any) -> bool:
    """Whether a JSON value is a string of valid Unicode.

    JSON escapes such as `\\ud800` decode to lone surrogates, which Python keeps in a `str` but
    no tokenizer accepts.
    """
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def read_text_parts(
    raw: Any, kinds: Collection[str], *, param: str, what: str, bad_part: str
) -> str:
    """Message content: a string as it is, or a list of `{"type": kind, "text": ...}` parts
    (each kind among `kinds`) joined; a 400 naming `param` otherwise (`bad_part` says what
    a part must be)."""
    if is_text(raw):
        return raw
    if isinstance(raw, list):
        parts = []
        for part in raw:
            if (
                not isinstance(part, dict)
                or part.get("type") not in kinds
                or not is_text(part.get("text"))
            ):
                raise InvalidRequestError(bad_part, param=param)
            parts.append(part["text"])
        return "".join(parts)
    raise InvalidRequestError(
        f"{what} must be a string of valid Unicode or a list of text parts", param=param
    )


def as_int(value: Any) -> int | None:
    """The integer a JSON value stands for, or None.

    `2.0` counts, as it does for JSON Schema and for vLLM's pydantic models; booleans do not.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def as_int_list(value: Any) -> list[int] | None:
    """The integers of a JSON list of integers, or None when it is not one."""
    if not isinstance(value, list):
        return None
    numbers = []
    for item in value:
        number = as_int(item)
        if number is None:
            return None
        numbers.append(number)
    return numbers


def _to_float(value: int | float) -> float:
    # JSON integers are unbounded; one beyond float range reads as infinite, which the domain
    # rejects with its own message, instead of escaping as an OverflowError (a 500).
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf
