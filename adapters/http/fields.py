"""Typed reads of JSON request fields; a wrong type becomes a 400 naming the field."""

from __future__ import annotations

from typing import Any

from domain.errors import InvalidRequestError


def _fail(name: str, kind: str) -> InvalidRequestError:
    return InvalidRequestError(f"`{name}` must be {kind}.", param=name)


def read_object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object", param=None)
    return body


def read_bool(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _fail(name, "a boolean")
    return value


def read_int(body: dict, name: str, default: int | None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(name, "an integer")
    return value


def read_float(body: dict, name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(name, "a number")
    return float(value)


def read_str(body: dict, name: str, default: str | None) -> str | None:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, str):
        raise _fail(name, "a string")
    return value


def read_int_list(body: dict, name: str) -> tuple[int, ...]:
    value = body.get(name)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(is_int(v) for v in value):
        raise _fail(name, "a list of integers")
    return tuple(value)


def read_stop(body: dict) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail("stop", "a string or a list of strings")
    return tuple(value)


def read_logit_bias(body: dict) -> tuple[tuple[int, float], ...]:
    value = body.get("logit_bias")
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise _fail("logit_bias", "an object mapping token IDs to numbers")
    pairs = []
    for key, bias in value.items():
        try:
            token_id = int(key)
        except ValueError:
            raise _fail("logit_bias", "an object mapping token IDs to numbers") from None
        if isinstance(bias, bool) or not isinstance(bias, (int, float)):
            raise _fail("logit_bias", "an object mapping token IDs to numbers")
        pairs.append((token_id, float(bias)))
    return tuple(pairs)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
