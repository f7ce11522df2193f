"""JSON bytes into a declared body, and the one mapping from msgspec's errors to the envelope.

A 400 names the body's top-level field in `param` (a member of `stream_options` or an item of
`messages` is reported as `stream_options` or `messages`) and the whole path in its message,
which finishes "`path` must be ..." with the declared type's description.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any, TypeVar

import msgspec
import msgspec.inspect as mi

from domain.common.errors import InvalidRequestError

T = TypeVar("T")

# Python refuses to convert decimal literals of more than 4300 digits (a ValueError: once a 500).
# Longer ones saturate at ±10**400: outside every integer range of the API, and past float range.
_MAX_DIGITS = 400
_SATURATED = 10**_MAX_DIGITS
# msgspec's messages end in " - at `$.a.b[0]`", or " - at `key` in `$.a`" for a mapping's key.
_WHERE = re.compile(r"^(?P<text>.*?)(?: - at (?:`key` in )?`\$(?P<path>[^`]*)`)?$", re.DOTALL)
_FIELD = re.compile(r"^Object (?P<kind>missing required|contains unknown) field `(?P<name>.*)`$")
_SEGMENT = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")


def decode(raw: bytes, body: type[T]) -> T:
    """The body `raw` declares, or a 400 in the envelope."""
    try:
        return msgspec.json.decode(raw, type=body)
    except msgspec.ValidationError as error:
        raise invalid(error, body) from None
    except RecursionError:
        raise InvalidRequestError("the request body is nested too deeply") from None
    except msgspec.DecodeError:
        # Malformed JSON, or JSON that msgspec refuses though it is valid: a `\ud800` escape (a
        # lone surrogate) or NaN. The standard library reads those; a lone surrogate is then a
        # 400 naming its field, and the rest is judged as declared.
        value = _read(raw)
    if isinstance(value, dict):
        _check_text(value, {f.encode_name for f in msgspec.structs.fields(body)})  # type: ignore[arg-type]
    return convert(value, body, "")


def convert(value: Any, member: Any, path: str) -> Any:
    """A member held as plain JSON (`path` is where it sits in the body) as its declared type,
    which may be an annotated union."""
    try:
        return msgspec.convert(value, type=member)
    except msgspec.ValidationError as error:
        raise invalid(error, member, prefix=path) from None
    except RecursionError:
        raise InvalidRequestError("the request body is nested too deeply") from None


def invalid(error: msgspec.ValidationError, body: Any, prefix: str = "") -> InvalidRequestError:
    """The one mapping: msgspec's message and path as the envelope's message and `param`."""
    where = _WHERE.match(str(error))
    assert where is not None  # the pattern matches any text
    text, path = where["text"], prefix + (where["path"] or "")
    field = _FIELD.match(text)
    # A field named at the top is the param whole, whatever characters its name holds.
    param = field["name"] if field is not None and not path else _top(path)
    if field is not None:
        path = f"{path}.{field['name']}"
    # A mapping's keys and values are shown as the mapping: their names are the sender's.
    shown = path.split("[...]")[0].lstrip(".")
    if param is None:
        return InvalidRequestError("the request body must be a JSON object", param=None)
    if field is not None and field["kind"] == "contains unknown":
        return InvalidRequestError(f"unknown field `{shown}`", param=param)
    if field is not None:
        return InvalidRequestError(f"`{shown}` is required", param=param)
    if text == "Number out of range":
        return InvalidRequestError(f"`{shown}` must be a finite number.", param=param)
    described = _description(body, path[len(prefix) :] if prefix else path)
    if described is None:
        return InvalidRequestError(f"`{shown}`: {text}", param=param)
    return InvalidRequestError(f"`{shown}` must be {described}.", param=param)


def _top(path: str) -> str | None:
    segment = _SEGMENT.match(path)
    return None if segment is None else segment[1]


def _description(body: Any, path: str) -> str | None:
    """The description of the declared type at `path`, or else of the nearest type holding it
    that has one (a mapping's keys and values are described by their mapping)."""
    node: mi.Type = _info(body)
    described = None
    for name, index in _SEGMENT.findall(path):
        node, found = _unwrap(node, mi.StructType if name else mi.ListType)
        described = found or described
        if index == "...":
            return described
        if isinstance(node, mi.StructType):
            node = next((f.type for f in node.fields if f.encode_name == name), mi.AnyType())
        elif isinstance(node, mi.ListType):
            node = node.item_type
        else:
            return described
    node, found = _unwrap(node, None)
    return found or described


def _unwrap(node: mi.Type, kind: type | None) -> tuple[mi.Type, str | None]:
    """The type under metadata and unions (the member of `kind`, or the one besides null),
    with the description found on the way."""
    described = None
    while True:
        if isinstance(node, mi.Metadata):
            described = (node.extra_json_schema or {}).get("description", described)
            node = node.type
        elif isinstance(node, mi.UnionType):
            members = [t for t in node.types if not isinstance(t, mi.NoneType)]
            chosen = [t for t in members if kind is not None and isinstance(_bare(t), kind)]
            if len(members) != 1 and len(chosen) != 1:
                return node, described
            node = members[0] if len(members) == 1 else chosen[0]
        else:
            return node, described


def _bare(node: mi.Type) -> mi.Type:
    while isinstance(node, mi.Metadata):
        node = node.type
    return node


@functools.cache
def _info(body: Any) -> mi.Type:
    return mi.type_info(body)


def _read(raw: bytes) -> Any:
    try:
        return json.loads(raw, parse_int=decimal_int)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InvalidRequestError(f"the request body is not valid JSON: {error}") from None
    except RecursionError:
        raise InvalidRequestError("the request body is nested too deeply") from None


def _check_text(body: dict, declared: set[str]) -> None:
    for name, value in body.items():
        if name in declared:
            bad = _bad_text(value, name)
            if bad is not None:
                raise InvalidRequestError(f"`{bad}` must be valid Unicode", param=name)


def _bad_text(value: Any, path: str) -> str | None:
    """The path of the first string (or key) inside `value` that is not valid Unicode.

    A walk with its own stack: json.loads reads nesting deeper than Python's call stack.
    """
    pending: list[tuple[str, Any]] = [(path, value)]
    while pending:
        where, item = pending.pop()
        if isinstance(item, str):
            if not is_text(item):
                return where
        elif isinstance(item, list):
            pending.extend(reversed([(f"{where}[{i}]", x) for i, x in enumerate(item)]))
        elif isinstance(item, dict):
            if not all(is_text(key) for key in item):
                return where
            pending.extend(reversed([(f"{where}.{key}", x) for key, x in item.items()]))
    return None


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
