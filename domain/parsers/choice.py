"""The parsing choice parser: reasoning, content and tool-call spans of a choice's text."""

from __future__ import annotations

import enum
from collections import deque

from domain.emission.entries import Part, PartMap, part_keeps
from domain.emission.outputs import ChoiceDelta, LogprobEntry
from domain.parsers.hermes import TOOL_CALL_END, TOOL_CALL_START, parse_call
from domain.parsers.parsed import ParsedDelta, ParserConfig
from domain.parsers.spans import held_prefix, leading_space
from domain.structured.tool_calls import ToolCallDelta, new_call_id


class _Mode(enum.Enum):
    OPENING = enum.auto()  # reasoning parser, nothing read yet: is there a start string?
    REASONING = enum.auto()
    AFTER_REASONING = enum.auto()  # whitespace right after the end string is stripped
    CONTENT = enum.auto()
    TOOL = enum.auto()  # the held text starts with a tool call's start string
    AFTER_TOOL = enum.auto()  # whitespace between and after calls is stripped


class SegmentingParser:
    """Splits a choice's text into reasoning, content, tool calls, delimiters and stripped
    whitespace; which tokens keep entries, and which count as reasoning, is decided by the
    part their first character lies in (`domain.emission.entries`).

    Text that may still turn out to be a delimiter is held back, and so are the entries of
    tokens starting in it; everything else is classified, and its entries released, as soon as
    it arrives. A tool call is held until its end string: valid JSON makes it a call, anything
    else (or a call cut short) stays content, as the model wrote it.
    """

    def __init__(self, index: int, config: ParserConfig) -> None:
        self._index = index
        self._config = config
        self._tools = config.tools and config.tool_call_parser is not None
        reasoning_first = config.reasoning_parser == "deepseek_r1" or config.prompt_in_reasoning
        # Without a start string, deepseek_r1 (or a prompt that opened the block) is reasoning
        # from the first character; qwen3 is plain content.
        self._unopened = _Mode.REASONING if reasoning_first else _Mode.CONTENT
        self._mode = _Mode.OPENING if config.reasoning_parser is not None else _Mode.CONTENT
        self._held = ""
        self._parts = PartMap()
        self._pending: deque[LogprobEntry] = deque()
        # The text offsets of the tokens not yet attributed, for the reasoning count.
        self._offsets: deque[int] = deque()
        self._calls = 0
        self._out: dict[Part, list[str]] = {}
        self._new_calls: list[ToolCallDelta] = []

    def feed(self, delta: ChoiceDelta) -> ParsedDelta:
        self._out = {Part.REASONING: [], Part.CONTENT: []}
        self._new_calls = []
        self._pending.extend(delta.logprobs)
        self._offsets.extend(delta.text_offsets)
        self._held += delta.text
        final = delta.finished
        while self._step(final):
            pass
        entries = self._release(final)
        thought = self._count_reasoning(final)
        self._forget()
        return ParsedDelta(
            self._index,
            reasoning="".join(self._out[Part.REASONING]),
            content="".join(self._out[Part.CONTENT]),
            content_logprobs=entries,
            tool_calls=tuple(self._new_calls),
            token_ids=delta.token_ids,
            finish_reason=delta.finish_reason,
            stop_reason=delta.stop_reason,
            reasoning_tokens=thought,
        )

    def _step(self, final: bool) -> bool:
        """Classifies what the mode can decide; True when the mode changed and may go on."""
        held = self._held
        if self._mode is _Mode.OPENING:
            start = self._config.reasoning_start
            if held.startswith(start):
                self._take(len(start), Part.DELIMITER)
                self._mode = _Mode.REASONING
                return True
            if not final and start.startswith(held):
                return False
            self._mode = self._unopened
            return True
        if self._mode is _Mode.REASONING:
            return self._until(self._config.reasoning_end, Part.REASONING, final)
        if self._mode is _Mode.AFTER_REASONING:
            space = leading_space(held)
            self._take(space, Part.STRIPPED)
            if space < len(held):
                self._mode = _Mode.CONTENT
                return True
            return False
        if self._mode is _Mode.CONTENT:
            if not self._tools:
                self._take(len(held), Part.CONTENT)
                return False
            return self._until(TOOL_CALL_START, Part.CONTENT, final)
        if self._mode is _Mode.TOOL:
            return self._tool_call(final)
        return self._after_tool(final)

    def _until(self, delimiter: str, part: Part, final: bool) -> bool:
        """Text of `part` up to `delimiter`; a possible start of the delimiter waits."""
        found = self._held.find(delimiter)
        if found < 0:
            keep = 0 if final else held_prefix(self._held, delimiter)
            self._take(len(self._held) - keep, part)
            return False
        self._take(found, part)
        if delimiter == TOOL_CALL_START:
            self._mode = _Mode.TOOL  # the start string stays held with the call
        else:
            self._take(len(delimiter), Part.DELIMITER)
            self._mode = _Mode.AFTER_REASONING
        return True

    def _tool_call(self, final: bool) -> bool:
        held = self._held
        end = held.find(TOOL_CALL_END, len(TOOL_CALL_START))
        if end < 0:
            if final:  # a call cut short is what the model wrote: content
                self._take(len(held), Part.CONTENT)
            return False
        body = held[len(TOOL_CALL_START) : end]
        call = parse_call(body)
        if call is None:
            self._take(end + len(TOOL_CALL_END), Part.CONTENT)
            self._mode = _Mode.CONTENT
            return True
        name, arguments = call
        self._take(len(TOOL_CALL_START), Part.DELIMITER)
        self._take(len(body), Part.TOOL)
        self._take(len(TOOL_CALL_END), Part.DELIMITER)
        self._new_calls.append(ToolCallDelta(self._calls, arguments, new_call_id(), name))
        self._calls += 1
        self._mode = _Mode.AFTER_TOOL
        return True

    def _after_tool(self, final: bool) -> bool:
        held = self._held
        space = leading_space(held)
        rest = held[space:]
        if rest.startswith(TOOL_CALL_START):
            self._take(space, Part.STRIPPED)
            self._mode = _Mode.TOOL
            return True
        if not final and TOOL_CALL_START.startswith(rest):
            return False  # only whitespace, or what may become the next call, so far
        if not rest:
            self._take(space, Part.STRIPPED)
            return False
        self._mode = _Mode.CONTENT  # text after the calls, its whitespace included
        return True

    def _take(self, length: int, part: Part) -> None:
        """Classifies the next `length` held characters as `part`."""
        if length == 0:
            return
        text, self._held = self._held[:length], self._held[length:]
        self._parts.add(length, part)
        if part in self._out:
            self._out[part].append(text)

    def _tail(self) -> Part | None:
        """The part a token with no text of its own at the end belongs to: reasoning while the
        block is still open (vLLM counts every token after the start marker until the end
        marker), otherwise the part the text ended in."""
        return Part.REASONING if self._mode is _Mode.REASONING else self._parts.last

    def _release(self, final: bool) -> tuple[LogprobEntry, ...]:
        """The entries of tokens whose first character is classified and keeps its entry,
        moved to offsets into the concatenated content."""
        parts = self._parts
        released: list[LogprobEntry] = []
        while self._pending and (final or self._pending[0].text_offset < parts.end):
            entry = self._pending.popleft()
            offset = entry.text_offset
            if part_keeps(parts.part_at(offset, tail=self._tail())):
                released.append(LogprobEntry(entry.position, parts.content_offset(offset)))
        return tuple(released)

    def _count_reasoning(self, final: bool) -> int:
        """The number of tokens, among those whose first character is now classified, that
        start in reasoning."""
        parts, offsets = self._parts, self._offsets
        count = 0
        while offsets and (final or offsets[0] < parts.end):
            offset = offsets.popleft()
            count += 1 if parts.part_at(offset, tail=self._tail()) is Part.REASONING else 0
        return count

    def _forget(self) -> None:
        """Later tokens and entries start at or after the text fed so far, or at their queue's
        head: spans before both are done with."""
        horizon = self._parts.end
        if self._pending:
            horizon = min(horizon, self._pending[0].text_offset)
        if self._offsets:
            horizon = min(horizon, self._offsets[0])
        self._parts.forget(horizon)
