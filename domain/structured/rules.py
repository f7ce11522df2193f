"""Which structured-output requests get a 400, and the grammar spec each valid one asks for."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace

from domain.common.errors import InvalidRequestError
from domain.common.wire import JsonObject
from domain.structured.grammar import GrammarKind, GrammarSpec
from domain.structured.tool_calls import ToolCallMode
from domain.structured.tool_choice import is_auto, tool_mode

_OUTPUT_KINDS = ("json", "regex", "choice", "grammar", "json_object")
MAX_CHOICES = 1024


@dataclass(frozen=True, slots=True)
class StructuredAsk:
    """A request's structured-output fields as the API spelled them (HTTP only checks that each
    is a JSON object, list, string or boolean as the field requires; None when absent)."""

    response_format: JsonObject | None = None
    structured_outputs: JsonObject | None = None
    tools: tuple[JsonObject, ...] | None = None
    tool_choice: str | JsonObject | None = None
    parallel_tool_calls: bool = True
    # Whether the server parses tool calls out of free text (`--enable-auto-tool-choice`).
    auto_tool_choice: bool = False


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """What the output is constrained to (None: free text) and, for forced tool calls, how the
    output becomes `tool_calls`."""

    grammar: GrammarSpec | None = None
    tool_calls: ToolCallMode | None = None
    # `tool_choice: "auto"` with tools on a server with auto tool choice: the output is free,
    # and the tool-call parser finds calls in it.
    auto_tools: bool = False


def resolve_structure(ask: StructuredAsk) -> StructuredOutput:
    """The constraint `ask` names; raises InvalidRequestError for the first rule it breaks.

    The rules, in order, as api.md lists them (`param` in brackets):
    1. `response_format.type` is not `text`, `json_object` or `json_schema`, or `json_schema`
       lacks an object `json_schema.schema` [`response_format`];
    2. `structured_outputs` sets none or more than one of `json`, `regex`, `choice`, `grammar`,
       `json_object`, or one of the wrong type (`json`: a schema object or its JSON text;
       `choice`: a non-empty list of strings) [`structured_outputs`];
    3. `tools` is not a list of function tools with names of 1-64 letters, digits, `_` or `-`,
       or has more than 128 [`tools`];
    4. `tool_choice` is not `none`, `auto`, `required` or a named function of `tools`; `auto`
       (also the default when `tools` are given) is served only with
       `--enable-auto-tool-choice` [`tool_choice`];
    5. more than one of `response_format` (other than text), `structured_outputs` and a forced
       tool call [`structured_outputs`, or `tool_choice`].
    The grammar itself (a schema's keywords, a regex, a grammar's syntax) is checked when it
    compiles, also before admission.
    """
    found: list[StructuredOutput] = []
    if ask.response_format is not None:
        found += _response_format(ask.response_format)
    if ask.structured_outputs is not None:
        found.append(StructuredOutput(_structured_outputs(ask.structured_outputs)))
        _single(found, "structured_outputs")
    mode = tool_mode(
        ask.tools, ask.tool_choice, parallel=ask.parallel_tool_calls, auto=ask.auto_tool_choice
    )
    if mode is not None:
        spec = GrammarSpec(GrammarKind.JSON_SCHEMA, _schema_text(mode.schema()), "tools")
        found.append(StructuredOutput(spec, mode))
        _single(found, "tool_choice")
    chosen = found[0] if found else StructuredOutput()
    if mode is None and ask.tools and ask.auto_tool_choice and is_auto(ask.tools, ask.tool_choice):
        # The parser looks for calls in whatever the output is constrained to, if anything.
        return replace(chosen, auto_tools=True)
    return chosen


def _single(found: list[StructuredOutput], param: str) -> None:
    if len(found) > 1:
        raise InvalidRequestError(
            "only one of `response_format`, `structured_outputs` and a forced tool call may "
            "constrain the output",
            param=param,
        )


def _response_format(value: Mapping[str, object]) -> list[StructuredOutput]:
    kind = value.get("type")
    if kind == "text":
        return []
    if kind == "json_object":
        return [StructuredOutput(_json_object("response_format"))]
    if kind == "json_schema":
        inner = value.get("json_schema")
        schema = inner.get("schema") if isinstance(inner, Mapping) else None
        if not isinstance(schema, Mapping):
            raise InvalidRequestError(
                "`response_format.json_schema.schema` must be a JSON schema object",
                param="response_format",
            )
        return [StructuredOutput(_json_schema(schema, "response_format"))]
    raise InvalidRequestError(
        "`response_format.type` must be one of text, json_object, json_schema",
        param="response_format",
    )


def _structured_outputs(value: Mapping[str, object]) -> GrammarSpec:
    # Identity, not equality: 0 is not `false` here, it is a json_object of the wrong type.
    named = [k for k in _OUTPUT_KINDS if value.get(k) is not None and value.get(k) is not False]
    if len(named) != 1:
        raise InvalidRequestError(
            f"`structured_outputs` must set exactly one of {', '.join(_OUTPUT_KINDS)}",
            param="structured_outputs",
        )
    kind, content = named[0], value[named[0]]
    param = "structured_outputs"
    if kind == "json_object" and content is not True:
        raise InvalidRequestError("`structured_outputs.json_object` must be a boolean", param=param)
    if kind == "json":
        if isinstance(content, str):
            content = _parse_json(content)
        if not isinstance(content, Mapping):
            raise InvalidRequestError(
                "`structured_outputs.json` must be a JSON schema object", param=param
            )
        return _json_schema(content, param)
    if kind == "json_object":
        return _json_object(param)
    if kind == "choice":
        return GrammarSpec(GrammarKind.CHOICE, _choices(content), param)
    if not isinstance(content, str):
        raise InvalidRequestError(f"`structured_outputs.{kind}` must be a string", param=param)
    return GrammarSpec(
        GrammarKind.REGEX if kind == "regex" else GrammarKind.GRAMMAR, content, param
    )


def _choices(content: object) -> str:
    if (
        not isinstance(content, list)
        or not 0 < len(content) <= MAX_CHOICES
        or not all(isinstance(choice, str) and choice for choice in content)
    ):
        raise InvalidRequestError(
            f"`structured_outputs.choice` must be a list of 1 to {MAX_CHOICES} non-empty strings",
            param="structured_outputs",
        )
    return json.dumps(content, ensure_ascii=False)


def _parse_json(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError as error:
        raise InvalidRequestError(
            f"`structured_outputs.json` is not valid JSON: {error}", param="structured_outputs"
        ) from None


def _json_schema(schema: Mapping[str, object], param: str) -> GrammarSpec:
    return GrammarSpec(GrammarKind.JSON_SCHEMA, _schema_text(schema), param)


def _json_object(param: str) -> GrammarSpec:
    return GrammarSpec(GrammarKind.JSON_OBJECT, '{"type":"object"}', param)


def _schema_text(schema: Mapping[str, object]) -> str:
    """The schema as compact JSON, keys in the caller's order: property order is output order."""
    return json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
