"""A forced tool call's output through the parsers: its content is the calls' JSON, tool data."""

from __future__ import annotations

import dataclasses

from domain.emission.entries import Part, part_keeps
from domain.emission.outputs import ChoiceDelta
from domain.parsers.parsed import ChoiceParser, ParsedDelta
from domain.structured.tool_calls import ToolCallMode, ToolCallStream, collect_tool_calls


class ForcedCallParser:
    """Reads a choice whose answer a grammar forces to be tool calls (`tool_choice` required or
    a named function): the inner parser splits off reasoning as usual, and the content it
    finds is the calls' JSON, turned into tool-call deltas as it grows.

    The entries of a forced call's tokens, for chat and Responses alike, follow the rule of
    `domain.emission.entries`: they are tool data (`Part.TOOL`), as a tool-call parser's call
    JSON is, so they have no content entries. Reasoning, its count, and the finish pass
    through unchanged.
    """

    def __init__(self, inner: ChoiceParser, mode: ToolCallMode) -> None:
        self._inner = inner
        self._calls = ToolCallStream(mode)

    def feed(self, delta: ChoiceDelta) -> ParsedDelta:
        return as_calls(self._inner.feed(delta), self._calls)


def as_calls(parsed: ParsedDelta, calls: ToolCallStream) -> ParsedDelta:
    """`parsed` with its content read as forced calls' JSON: call deltas, and the content's
    entries only as far as tool data keeps entries (it keeps none)."""
    found = calls.feed(parsed.content) if parsed.content else []
    kept = parsed.content_logprobs if part_keeps(Part.TOOL) else ()
    return dataclasses.replace(
        parsed, content="", content_logprobs=kept, tool_calls=(*parsed.tool_calls, *found)
    )


def whole_forced_answer(parsed: ParsedDelta, mode: ToolCallMode) -> ParsedDelta:
    """A whole answer's parse (made without the forced call) under the forced call: its calls,
    or, when the content is not complete JSON of the forced shape (cut short by the token limit
    or a stop string), the content as the model wrote it, a content's entries and all."""
    if collect_tool_calls(mode, parsed.content) is None:
        return parsed
    return as_calls(parsed, ToolCallStream(mode))
