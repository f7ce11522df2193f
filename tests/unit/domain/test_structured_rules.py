"""Which structured-output requests get a 400, and the spec each valid one compiles."""

from __future__ import annotations

import json

import pytest

from domain.common.errors import InvalidRequestError
from domain.structured.grammar import MAX_GRAMMAR_CHARS, GrammarKind, GrammarSpec
from domain.structured.rules import StructuredAsk, resolve_structure

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def test_nothing_asked_constrains_nothing():
    assert resolve_structure(StructuredAsk()).grammar is None
    assert resolve_structure(StructuredAsk(response_format={"type": "text"})).grammar is None


def test_a_json_schema_keeps_the_callers_property_order():
    schema = {"type": "object", "properties": {"z": {}, "a": {}}}
    ask = StructuredAsk(response_format={"type": "json_schema", "json_schema": {"schema": schema}})

    spec = resolve_structure(ask).grammar

    assert spec == GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(schema, separators=(",", ":")))
    assert spec is not None and spec.param == "response_format"


@pytest.mark.parametrize(
    ("outputs", "kind"),
    [
        ({"json": {"type": "string"}}, GrammarKind.JSON_SCHEMA),
        ({"json": '{"type": "string"}'}, GrammarKind.JSON_SCHEMA),
        ({"regex": "a+"}, GrammarKind.REGEX),
        ({"choice": ["x", "y"]}, GrammarKind.CHOICE),
        ({"grammar": 'start: "a"'}, GrammarKind.GRAMMAR),
        ({"json_object": True}, GrammarKind.JSON_OBJECT),
        ({"regex": "a+", "json_object": False}, GrammarKind.REGEX),
    ],
)
def test_each_structured_outputs_kind_names_its_grammar(outputs, kind):
    spec = resolve_structure(StructuredAsk(structured_outputs=outputs)).grammar

    assert spec is not None and spec.kind is kind and spec.param == "structured_outputs"


def test_equal_json_schemas_given_as_object_or_text_are_one_spec():
    as_object = resolve_structure(StructuredAsk(structured_outputs={"json": {"type": "string"}}))
    as_text = resolve_structure(StructuredAsk(structured_outputs={"json": '{"type":"string"}'}))

    assert as_object.grammar == as_text.grammar


@pytest.mark.parametrize(
    ("ask", "param"),
    [
        (StructuredAsk(response_format={"type": "xml"}), "response_format"),
        (
            StructuredAsk(response_format={"type": "json_schema", "json_schema": {}}),
            "response_format",
        ),
        (StructuredAsk(structured_outputs={}), "structured_outputs"),
        (StructuredAsk(structured_outputs={"regex": 5}), "structured_outputs"),
        (StructuredAsk(structured_outputs={"choice": ["a", ""]}), "structured_outputs"),
        (StructuredAsk(structured_outputs={"json": "[1"}), "structured_outputs"),
        (StructuredAsk(structured_outputs={"json": "[1]"}), "structured_outputs"),
        (
            StructuredAsk(structured_outputs={"regex": "a" * (MAX_GRAMMAR_CHARS + 1)}),
            "structured_outputs",
        ),
        (
            StructuredAsk(
                response_format={"type": "json_object"}, structured_outputs={"regex": "a"}
            ),
            "structured_outputs",
        ),
        (StructuredAsk(tools=(TOOL,)), "tool_choice"),
        (StructuredAsk(tools=(TOOL,), tool_choice="sometimes"), "tool_choice"),
        (StructuredAsk(tools=({"type": "code"},), tool_choice="required"), "tools"),
        (
            StructuredAsk(
                tools=({"type": "function", "function": {"name": "f", "parameters": []}},),
                tool_choice="required",
            ),
            "tools",
        ),
        (
            StructuredAsk(
                tools=(TOOL,), tool_choice="required", response_format={"type": "json_object"}
            ),
            "tool_choice",
        ),
    ],
)
def test_each_broken_rule_is_a_400_naming_its_field(ask, param):
    with pytest.raises(InvalidRequestError) as caught:
        resolve_structure(ask)

    assert caught.value.param == param


def test_tool_choice_none_ignores_the_tools():
    assert resolve_structure(StructuredAsk(tools=(TOOL,), tool_choice="none")).grammar is None


def test_a_named_tool_constrains_to_its_parameters_and_required_to_an_array_of_calls():
    named = resolve_structure(
        StructuredAsk(tools=(TOOL,), tool_choice={"type": "function", "function": {"name": "f"}})
    )
    required = resolve_structure(
        StructuredAsk(tools=(TOOL,), tool_choice="required", parallel_tool_calls=False)
    )

    assert named.grammar is not None and json.loads(named.grammar.source) == {"type": "object"}
    assert required.grammar is not None and required.grammar.param == "tools"
    array = json.loads(required.grammar.source)
    assert array["type"] == "array" and array["minItems"] == 1 and array["maxItems"] == 1
    (call,) = array["items"]["anyOf"]
    assert list(call["properties"]) == ["name", "parameters"]
    assert call["properties"]["name"] == {"type": "string", "enum": ["f"]}
