"""Chat wire objects of parsed output: reasoning, content and tool calls, whole or as deltas."""

from __future__ import annotations

from domain.common.wire import JsonObject
from domain.parsers.parsed import ParsedDelta
from domain.structured.tool_calls import ToolCall


def parsed_message(parsed: ParsedDelta, *, reasoning: bool) -> JsonObject:
    """A whole choice's message. vLLM sends the reasoning as both `reasoning` and (older)
    `reasoning_content`; content is null when the answer is only tool calls."""
    calls = [
        ToolCall(d.id, d.name, d.arguments).to_wire()
        for d in parsed.tool_calls
        if d.id is not None and d.name is not None
    ]
    message: JsonObject = {
        "role": "assistant",
        "content": None if calls and not parsed.content else parsed.content,
        "tool_calls": calls,
    }
    if reasoning:
        message["reasoning"] = parsed.reasoning or None
        message["reasoning_content"] = parsed.reasoning or None
    return message


def parsed_delta(parsed: ParsedDelta) -> JsonObject:
    """A streamed chunk's `delta`: only the parts this delta has."""
    delta: JsonObject = {}
    if parsed.reasoning:
        delta["reasoning"] = parsed.reasoning
        delta["reasoning_content"] = parsed.reasoning
    if parsed.content:
        delta["content"] = parsed.content
    if parsed.tool_calls:
        delta["tool_calls"] = [d.to_wire() for d in parsed.tool_calls]
    return delta
