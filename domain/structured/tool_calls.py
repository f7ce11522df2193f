"""Forced tool calls: the JSON a constrained call must follow, and its output as `tool_calls`."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from domain.common.wire import JsonObject

# What a function without `parameters` takes: nothing, so its arguments are `{}`.
NO_PARAMETERS: JsonObject = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True, slots=True)
class ToolCallMode:
    """How a chat request forces tool calls: `named` calls that one function (the output is its
    arguments); otherwise (`tool_choice: "required"`) the output is a JSON array of one or more
    `{"name": ..., "parameters": ...}` calls of the listed functions, at most one when
    `parallel` is off."""

    functions: tuple[tuple[str, JsonObject], ...]
    named: str | None = None
    parallel: bool = True

    def schema(self) -> JsonObject:
        """The JSON schema the output is constrained to (vLLM's layout for `required`)."""
        parameters = dict(self.functions)
        if self.named is not None:
            return parameters[self.named]
        calls = [
            {
                "type": "object",
                "properties": {"name": {"type": "string", "enum": [name]}, "parameters": schema},
                "required": ["name", "parameters"],
                "additionalProperties": False,
            }
            for name, schema in self.functions
        ]
        array: JsonObject = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
        if not self.parallel:
            array["maxItems"] = 1
        return array


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """New content of call `index`: its header once (`id` and `name` set), then argument text."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None

    def to_wire(self) -> JsonObject:
        """A streamed `delta.tool_calls` item, as vLLM streams them."""
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        return {
            "index": self.index,
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


class ToolCallStream:
    """Turns a constrained output's text, as it arrives, into tool-call deltas.

    A named call's arguments are the whole text. For `required` the text is scanned as JSON:
    each object of the top-level array is one call; its header goes out when its `name` string
    closes, and its arguments are the raw text of its `parameters` value, passed on as it grows,
    so streamed arguments concatenate to exactly the non-streamed ones.
    """

    def __init__(self, mode: ToolCallMode) -> None:
        self._named = mode.named
        self._index = -1
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._expect_key = False
        self._token: list[str] = []  # the string at depth 2 being read
        self._key = ""
        # The parameters value: armed after its colon, capturing from its first character.
        self._armed = False
        self._capturing = False
        self._name: str | None = None
        self._announced = False
        self._pending: list[str] = []

    def feed(self, text: str) -> list[ToolCallDelta]:
        if self._named is not None:
            return self._feed_named(text)
        deltas: list[ToolCallDelta] = []
        for char in text:
            self._step(char, deltas)
        self._flush(deltas)
        return deltas

    def _feed_named(self, text: str) -> list[ToolCallDelta]:
        if not self._announced:
            self._announced = True
            return [ToolCallDelta(0, text, new_call_id(), self._named)]
        return [ToolCallDelta(0, text)] if text else []

    def _step(self, char: str, deltas: list[ToolCallDelta]) -> None:
        if self._armed and not char.isspace():
            self._armed, self._capturing = False, True
        if self._capturing and not self._in_string and self._depth == 2 and char in ",}":
            self._capturing = False
        if self._capturing:
            self._pending.append(char)
        if self._in_string:
            self._string_char(char)
            return
        if char == '"':
            self._in_string = True
            self._token = []
        elif char in "{[":
            self._depth += 1
            if self._depth == 2 and char == "{":
                self._flush(deltas)
                self._index += 1
                self._name, self._announced, self._expect_key = None, False, True
        elif char in "}]":
            self._depth -= 1
        elif self._depth == 2 and char == ",":
            self._expect_key = True
        elif self._depth == 2 and char == ":":
            self._expect_key = False
            self._armed = self._key == "parameters"

    def _string_char(self, char: str) -> None:
        if self._escaped:
            self._escaped = False
        elif char == "\\":
            self._escaped = True
        elif char == '"':
            self._in_string = False
            if self._depth == 2 and self._expect_key:
                self._key = json.loads('"' + "".join(self._token) + '"')
            elif self._depth == 2 and self._key == "name":
                self._name = json.loads('"' + "".join(self._token) + '"')
            return
        self._token.append(char)

    def _flush(self, deltas: list[ToolCallDelta]) -> None:
        """One delta per call and feed: the header (with any argument text so far) once the
        name is known, then the argument text that arrived since."""
        if self._name is not None and not self._announced:
            self._announced = True
            arguments, self._pending = "".join(self._pending), []
            deltas.append(ToolCallDelta(self._index, arguments, new_call_id(), self._name))
        elif self._announced and self._pending:
            deltas.append(ToolCallDelta(self._index, "".join(self._pending)))
            self._pending = []


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str

    def to_wire(self) -> JsonObject:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def collect_tool_calls(mode: ToolCallMode, text: str) -> tuple[ToolCall, ...] | None:
    """The calls of a whole output, or None when it is not complete JSON of the forced shape
    (an output cut short by `max_tokens`). Fed at once, the stream gives one delta per call,
    header and whole arguments together."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if mode.named is None and not (isinstance(value, list) and value):
        return None
    calls = [
        ToolCall(delta.id, delta.name, delta.arguments)
        for delta in ToolCallStream(mode).feed(text)
        if delta.id is not None and delta.name is not None
    ]
    return tuple(calls)


def new_call_id() -> str:
    """A tool call ID in vLLM's shape."""
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def function_parameters(function: Mapping[str, object]) -> JsonObject:
    """A function's `parameters` schema, or the schema of no arguments."""
    parameters = function.get("parameters")
    return dict(parameters) if isinstance(parameters, Mapping) else dict(NO_PARAMETERS)
