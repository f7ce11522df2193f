"""Hostile values in every request field of every operation, against the contract's schemas.

Huge integers, huge or fractional floats and absurdly long strings go into each body property
of `contracts/openapi.yaml` (and into the items and members of the sample bodies). Whatever the
value, the answer is never a server error; a body the contract rejects is never a 200; every
error is the OpenAI envelope with a status the operation documents, and a 400 or 404 names the
field that carries the value.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

import falcon.asgi
import falcon.testing
import jsonschema_rs
import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from adapters.http.app import OPENAPI_PATH
from tests.support.hostile import (
    MAX_BODY_BYTES,
    Hostile,
    float_literal,
    fractional_floats,
    huge_floats,
    huge_integers,
    integer_literal,
    long_strings,
    string_literal,
)

CONTRACT = yaml.safe_load(OPENAPI_PATH.read_text(encoding="utf-8"))
ENVELOPE_KEYS = {"message", "type", "param", "code"}
# Valid bodies that every hostile value is put into; each must answer 200 as it is.
BASES: dict[str, tuple[dict, ...]] = {
    "/v1/completions": (
        {"prompt": "hi", "max_tokens": 1},
        {
            "prompt": [[5, 6]],
            "max_tokens": 1,
            "stop": ["x"],
            "stop_token_ids": [7],
            "logit_bias": {"5": 1},
            "logprobs": 1,
            "logprob_token_ids": [5],
        },
        {
            "prompt": "hi",
            "max_tokens": 1,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
        {"prompt": "hi", "max_tokens": 1, "structured_outputs": {"regex": "[a-z]+"}},
        {"prompt": "hi", "max_tokens": 1, "structured_outputs": {"choice": ["yes", "no"]}},
    ),
    "/v1/chat/completions": (
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
        {
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {"role": "assistant", "tool_calls": [{"id": "call-1", "type": "function"}]},
                {"role": "user", "content": "go on"},
            ],
            "max_completion_tokens": 1,
            "stop": ["x"],
            "logit_bias": {"5": 1},
            "logprobs": True,
            "top_logprobs": 1,
        },
        {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "t", "schema": {"type": "object"}},
            },
        },
        {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1,
            "tools": [
                {
                    "type": "function",
                    "function": {"name": "f", "parameters": {"type": "object"}},
                }
            ],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
            "parallel_tool_calls": True,
        },
    ),
    "/v1/responses": (
        {"input": "hi", "max_output_tokens": 1},
        {
            "input": [
                {"role": "developer", "content": "be brief"},
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "hi"}],
                },
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "ok"},
            ],
            "instructions": "be kind",
            "max_output_tokens": 1,
            "temperature": 0.5,
            "include": ["message.output_text.logprobs"],
            "top_logprobs": 1,
            "logprob_token_ids": [5],
            "stop": ["x"],
            "logit_bias": {"5": 1},
            "metadata": {"k": "v"},
            "reasoning": {"effort": "low"},
            "user": "u",
            "store": False,
        },
        {
            "input": "hi",
            "max_output_tokens": 1,
            "stream": True,
            "stream_options": {"include_obfuscation": False},
        },
        {
            "input": "hi",
            "max_output_tokens": 1,
            "tools": [
                {
                    "type": "function",
                    "name": "f",
                    "description": "d",
                    "parameters": {"type": "object"},
                    "strict": True,
                }
            ],
            "tool_choice": {"type": "function", "name": "f"},
            "parallel_tool_calls": True,
        },
        {
            "input": "hi",
            "max_output_tokens": 1,
            "text": {"format": {"type": "json_schema", "name": "t", "schema": {"type": "object"}}},
        },
    ),
    "/tokenize": ({"prompt": "hi"}, {"messages": [{"role": "user", "content": "hi"}]}),
    "/detokenize": ({"tokens": [5, 6]},),
}
# Deep enough for a chat text part's `text`: messages / index / content / index / text.
MAX_DEPTH = 5
PLACEHOLDER = "\x00hostile\x00"


def _request_schema(path: str) -> dict:
    reference = CONTRACT["paths"][path]["post"]["requestBody"]["content"]["application/json"]
    return reference["schema"]


def _validator(schema: dict) -> Any:
    return jsonschema_rs.validator_for({**schema, "components": CONTRACT["components"]})


def _resolve(schema: dict) -> dict:
    while "$ref" in schema:
        *_, name = schema["$ref"].split("/")
        schema = CONTRACT["components"]["schemas"][name]
    return schema


def _properties(schema: dict, body: dict) -> list[str]:
    """The body properties the schema declares, through the branches `body` takes."""
    schema = _resolve(schema)
    names = list(schema.get("properties", {}))
    for part in schema.get("allOf", []):
        names += _properties(part, body)
    for part in schema.get("anyOf", []):
        if _validator(part).is_valid(body):
            names += _properties(part, body)
    return list(dict.fromkeys(names))


def _nested_paths(value: Any, prefix: tuple) -> list[tuple]:
    """Every item and member path inside a property's value, down to MAX_DEPTH; a list of
    numbers or strings is represented by its first item."""
    if len(prefix) >= MAX_DEPTH or not isinstance(value, (list, dict)) or not value:
        return []
    if isinstance(value, dict):
        keys = list(value)
    elif any(isinstance(item, (list, dict)) for item in value):
        keys = range(len(value))
    else:
        keys = [0]
    paths = []
    for key in keys:
        paths.append((*prefix, key))
        paths += _nested_paths(value[key], (*prefix, key))
    return paths


@dataclass(frozen=True)
class Slot:
    """Where a hostile value goes: an operation, the sample body, a path inside it."""

    operation: str
    base: int
    path: tuple

    def __str__(self) -> str:
        return f"{self.operation}#{self.base}:{'.'.join(map(str, self.path))}"


def _slots() -> list[Slot]:
    slots: dict[tuple, Slot] = {}
    for operation, bases in BASES.items():
        for index, base in enumerate(bases):
            paths = [(name,) for name in _properties(_request_schema(operation), base)]
            for name, value in base.items():
                paths += _nested_paths(value, (name,))
            for path in paths:
                slots.setdefault((operation, path), Slot(operation, index, path))
    return list(slots.values())


SLOTS = _slots()
VALIDATORS = {operation: _validator(_request_schema(operation)) for operation in BASES}


def _place(body: Any, path: tuple, value: Any) -> Any:
    """A copy of `body` with `value` at `path`."""
    if not path:
        return value
    key, rest = path[0], path[1:]
    container = copy.copy(body)
    # Nested paths come from the sample body, so every key before the last exists there.
    container[key] = _place(body[key] if rest else None, rest, value)
    return container


def _documented_statuses(operation: str) -> set[int]:
    return {int(code) for code in CONTRACT["paths"][operation]["post"]["responses"]}


def _send(app: falcon.asgi.App, slot: Slot, hostile: Hostile) -> tuple[falcon.testing.Result, int]:
    body = _place(BASES[slot.operation][slot.base], slot.path, PLACEHOLDER)
    wire = json.dumps(body).replace(json.dumps(PLACEHOLDER), hostile.literal).encode()
    result = falcon.testing.TestClient(app).simulate_post(
        slot.operation, body=wire, headers={"Content-Type": "application/json"}
    )
    return result, len(wire)


def _check(app: falcon.asgi.App, slot: Slot, hostile: Hostile) -> None:
    result, size = _send(app, slot, hostile)
    status = result.status_code
    judged = _place(BASES[slot.operation][slot.base], slot.path, hostile.judged)
    seen = f"{slot} = {hostile!r} -> {status} {result.text[:200]}"

    assert status < 500, seen
    if size > MAX_BODY_BYTES:
        assert status == 413, seen
    if not VALIDATORS[slot.operation].is_valid(judged):
        assert status != 200, f"the contract rejects this body, the server took it: {seen}"
    if status == 200:
        return
    assert status in _documented_statuses(slot.operation), seen
    error = result.json["error"]
    assert set(error) == ENVELOPE_KEYS and error["code"] == status, seen
    if status in (400, 404):
        # Chat text that makes the rendered prompt too long is reported against `prompt`.
        named = {slot.path[0], "prompt"} if isinstance(hostile.judged, str) else {slot.path[0]}
        assert error["param"] in named, seen


@pytest.mark.parametrize(
    "base", [(op, i) for op, bases in BASES.items() for i in range(len(bases))]
)
def test_every_sample_body_is_served_as_it_is(contract_app: falcon.asgi.App, base: tuple) -> None:
    operation, index = base
    body = BASES[operation][index]

    result = falcon.testing.TestClient(contract_app).simulate_post(operation, json=body)

    assert VALIDATORS[operation].is_valid(body)
    assert result.status_code == 200, result.text


@pytest.mark.parametrize("slot", SLOTS, ids=str)
@settings(max_examples=3)
@given(values=st.tuples(huge_integers(), huge_floats(), fractional_floats(), long_strings()))
# The battery that once found 500s, sent to every slot whatever Hypothesis draws.
@example(
    values=(
        integer_literal(5_000),
        float_literal(1e300),
        float_literal(2.5),
        string_literal("x" * 100_000),
    )
)
@example(
    values=(
        integer_literal(100_000, negative=True),
        float_literal(-1e300),
        float_literal(0.5),
        string_literal("é" * 300),
    )
)
@example(
    values=(
        Hostile(str(2**63), 2**63),
        Hostile("1e400", float("inf")),
        float_literal(-2.5),
        string_literal("1" * 400),
    )
)
def test_a_hostile_value_in_any_field_is_refused_in_the_envelope_or_served(
    contract_app: falcon.asgi.App, slot: Slot, values: tuple[Hostile, ...]
) -> None:
    for hostile in values:
        _check(contract_app, slot, hostile)


@pytest.mark.parametrize("operation", list(BASES))
def test_a_body_over_the_limit_is_a_413_on_every_operation(
    contract_app: falcon.asgi.App, operation: str
) -> None:
    slot = Slot(operation, 0, (next(iter(BASES[operation][0])),))

    result, size = _send(contract_app, slot, string_literal("x" * MAX_BODY_BYTES))

    assert size > MAX_BODY_BYTES
    assert result.status_code == 413
    assert set(result.json["error"]) == ENVELOPE_KEYS
