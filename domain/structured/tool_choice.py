"""Which `tools` and `tool_choice` force tool calls, and of which functions (rules 3 and 4)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from domain.common.errors import InvalidRequestError
from domain.common.wire import JsonObject
from domain.structured.tool_calls import ToolCallMode, function_parameters

_FUNCTION_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
MAX_TOOLS = 128


def tool_mode(
    tools: tuple[JsonObject, ...] | None,
    choice: str | JsonObject | None,
    *,
    parallel: bool = True,
    auto: bool = False,
) -> ToolCallMode | None:
    """The forced tool calls `tools` and `tool_choice` ask for; None for "none" (the default
    without tools) and for "auto" (the default with tools), which only a server running a
    tool-call parser with auto tool choice (`auto`) serves. Rules 3 and 4 of
    `domain.structured.rules.resolve_structure`."""
    functions = _functions(tools) if tools is not None else ()
    if is_auto(functions, choice):
        if not auto:
            raise InvalidRequestError(
                '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser '
                'to be set; use "required", a named function, or "none"',
                param="tool_choice",
            )
        return None
    if choice is None or choice == "none":
        return None
    if not functions:
        raise InvalidRequestError("`tool_choice` needs `tools`", param="tool_choice")
    if choice == "required":
        return ToolCallMode(functions, parallel=parallel)
    name = _named_function(choice)
    if name not in dict(functions):
        raise InvalidRequestError(
            f"`tool_choice` names {name!r}, which is not in `tools`", param="tool_choice"
        )
    return ToolCallMode(functions, named=name)


def is_auto(functions: tuple[object, ...], choice: str | JsonObject | None) -> bool:
    """Whether the model chooses between answering and calling: "auto", or no choice with
    tools, as in OpenAI's API."""
    return choice == "auto" or (choice is None and bool(functions))


def _named_function(choice: str | JsonObject) -> str:
    function = choice.get("function") if isinstance(choice, Mapping) else None
    name = function.get("name") if isinstance(function, Mapping) else None
    if (
        not isinstance(choice, Mapping)
        or choice.get("type") != "function"
        or not isinstance(name, str)
    ):
        raise InvalidRequestError(
            '`tool_choice` must be "none", "auto", "required" or '
            '{"type": "function", "function": {"name": ...}}',
            param="tool_choice",
        )
    return name


def _functions(tools: tuple[JsonObject, ...]) -> tuple[tuple[str, JsonObject], ...]:
    if len(tools) > MAX_TOOLS:
        raise InvalidRequestError(f"at most {MAX_TOOLS} tools are allowed", param="tools")
    functions: dict[str, JsonObject] = {}
    for tool in tools:
        function = tool.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        if (
            tool.get("type") != "function"
            or not isinstance(function, Mapping)
            or not isinstance(name, str)
            or not _FUNCTION_NAME.fullmatch(name)
        ):
            raise InvalidRequestError(
                'each tool must be {"type": "function", "function": {"name": ...}} with a name '
                "of 1 to 64 letters, digits, underscores or dashes",
                param="tools",
            )
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, Mapping):
            raise InvalidRequestError(
                f"the parameters of tool {name!r} must be a JSON schema object", param="tools"
            )
        functions[name] = function_parameters(function)
    return tuple(functions.items())
