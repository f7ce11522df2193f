"""What a Responses body may hold: the members it declares and the values it serves.

Unknown fields are a 400 naming them; fields that change nothing generated (`background`,
`truncation`, `service_tier`) are taken at their neutral values only. `tools` and `tool_choice`
are echoed as they were sent, so they stay plain JSON and are checked against their
declarations here, then spelled as chat spells them for the tool rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from adapters.http.requests.declared import Flag, JsonObject, StrictBody, Text
from adapters.http.requests.decoding import convert
from domain.common.wire import JsonObject as WireObject

MAX_METADATA_PAIRS = 16
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")

Background = Annotated[Literal[False], Meta(description="false: nothing else is served")]
Truncation = Annotated[Literal["disabled"], Meta(description="'disabled': nothing else is served")]
ServiceTier = Annotated[
    Literal["auto", "default"], Meta(description="'auto' or 'default': nothing else is served")
]
Metadata = Annotated[
    dict[Annotated[str, Meta(max_length=64)], Annotated[str, Meta(max_length=512)]],
    Meta(
        max_length=MAX_METADATA_PAIRS,
        description=f"at most {MAX_METADATA_PAIRS} pairs of keys up to 64 characters and "
        "string values up to 512",
    ),
]
Include = Annotated[list[str], Meta(description="a list of strings")]


class StreamOptions(StrictBody, frozen=True):
    include_obfuscation: Flag | None = None


class Reasoning(StrictBody, frozen=True):
    """`effort` is recorded and echoed; generation does not depend on it."""

    effort: (
        Annotated[
            Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"],
            Meta(description=f"one of {', '.join(EFFORTS)}"),
        ]
        | None
    ) = None
    summary: Annotated[None, Meta(description="unset: reasoning summaries are not generated")] = (
        None
    )
    generate_summary: Annotated[
        None, Meta(description="unset: reasoning summaries are not generated")
    ] = None


class _Optional(Struct, frozen=True, kw_only=True):
    """`description` and `strict` are accepted, not used: every schema is enforced strictly."""

    description: Text | None = None
    strict: Flag | None = None


class FormatText(_Optional, tag_field="type", tag="text", frozen=True):
    pass


class FormatJsonObject(_Optional, tag_field="type", tag="json_object", frozen=True):
    pass


class FormatJsonSchema(_Optional, tag_field="type", tag="json_schema", kw_only=True, frozen=True):
    schema: JsonObject
    name: Text


class TextSettings(StrictBody, frozen=True):
    format: (
        Annotated[
            FormatText | FormatJsonObject | FormatJsonSchema,
            Meta(description="an object whose `type` is text, json_object or json_schema"),
        ]
        | None
    ) = None
    verbosity: Annotated[None, Meta(description="unset: it is not served")] = None


class FunctionTool(StrictBody, frozen=True):
    type: Annotated[
        Literal["function"], Meta(description="'function': only function tools are served")
    ]
    name: Annotated[
        str,
        Meta(
            pattern=r"^[a-zA-Z0-9_-]{1,64}\Z",
            description="1 to 64 letters, digits, underscores or dashes",
        ),
    ]
    description: Text | None = None
    parameters: JsonObject | None = None
    strict: Flag | None = None


class FunctionChoice(Struct, frozen=True):
    type: Literal["function"]
    name: Text


ToolChoice = Annotated[
    Literal["none", "auto", "required"] | FunctionChoice,
    Meta(description='"none", "auto", "required" or {"type": "function", "name": ...}'),
]


def chat_tool(tool: Mapping[str, Any], index: int) -> WireObject:
    """A Responses function tool (flat) in chat's spelling, which the tool rules read."""
    convert(tool, FunctionTool, f".tools[{index}]")
    function = {key: tool[key] for key in ("name", "description", "parameters") if key in tool}
    return {"type": "function", "function": function}


def chat_tool_choice(choice: Any) -> str | WireObject | None:
    if choice is None:
        return None
    declared: str | FunctionChoice = convert(choice, ToolChoice, ".tool_choice")
    if isinstance(declared, str):
        return declared
    return {"type": "function", "function": {"name": declared.name}}


def text_format(text: TextSettings | None) -> WireObject:
    """`text.format` as the response echoes it."""
    form = None if text is None else text.format
    if form is None or isinstance(form, FormatText):
        return {"type": "text"}
    if isinstance(form, FormatJsonObject):
        return {"type": "json_object"}
    values = {
        "type": "json_schema",
        "name": form.name,
        "schema": form.schema,
        "description": form.description,
        "strict": form.strict,
    }
    return {key: value for key, value in values.items() if value is not None}


def response_format(text_format: WireObject) -> WireObject:
    """`text.format` as chat's `response_format`, which the structured-output rules read."""
    if text_format["type"] == "json_schema":
        inner = {"name": text_format["name"], "schema": text_format["schema"]}
        return {"type": "json_schema", "json_schema": inner}
    return {"type": text_format["type"]}
