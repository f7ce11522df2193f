"""The hermes tool-call format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`."""

from __future__ import annotations

import json

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"


def parse_call(body: str) -> tuple[str, str] | None:
    """The name and JSON arguments of one call's body, or None when it is not a call.

    The arguments are re-serialised with `json.dumps` defaults, as vLLM's hermes parser does, so
    streamed and whole answers carry the same string.
    """
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", {})
    if not isinstance(arguments, dict):
        return None
    return value["name"], json.dumps(arguments, ensure_ascii=False)
