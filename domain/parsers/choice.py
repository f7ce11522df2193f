"""The parsing choice parser: reasoning and tool-call spans, and content entry attribution."""

from __future__ import annotations

import enum
from collections import deque

from domain.emission.outputs import ChoiceDelta, LogprobEntry
from domain.parsers.hermes import TOOL_CALL_END, TOOL_CALL_START, parse_call
from domain.parsers.parsed import ParsedDelta, ParserConfig
from domain.parsers.spans import Kind, held_prefix, leading_space
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
    whitespace, and gives content the entries of the tokens whose first character it holds.

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
        self._position = 0  # raw offset of the first held character
        self._content_length = 0
        self._last_kind: Kind | None = None
        # Content ranges not yet passed by every entry: (raw start, raw end, content start).
        self._ranges: deque[tuple[int, int, int]] = deque()
        self._pending: deque[LogprobEntry] = deque()
        # Reasoning ranges not yet passed by every token (raw start, raw end), and the text
        # offsets of the tokens not yet attributed.
        self._reasoning: deque[tuple[int, int]] = deque()
        self._offsets: deque[int] = deque()
        self._calls = 0
        self._out: dict[Kind, list[str]] = {}
        self._new_calls: list[ToolCallDelta] = []

    def feed(self, delta: ChoiceDelta) -> ParsedDelta:
        self._out = {Kind.REASONING: [], Kind.CONTENT: []}
        self._new_calls = []
        self._pending.extend(delta.logprobs)
        self._offsets.extend(delta.text_offsets)
        self._held += delta.text
        final = delta.finished
        while self._step(final):
            pass
        entries = self._release(final)
        thought = self._count_reasoning(final)
        return ParsedDelta(
            self._index,
            reasoning="".join(self._out[Kind.REASONING]),
            content="".join(self._out[Kind.CONTENT]),
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
                self._take(len(start), Kind.DELIMITER)
                self._mode = _Mode.REASONING
                return True
            if not final and start.startswith(held):
                return False
            self._mode = self._unopened
            return True
        if self._mode is _Mode.REASONING:
            return self._until(self._config.reasoning_end, Kind.REASONING, final)
        if self._mode is _Mode.AFTER_REASONING:
            space = leading_space(held)
            self._take(space, Kind.STRIPPED)
            if space < len(held):
                self._mode = _Mode.CONTENT
                return True
            return False
        if self._mode is _Mode.CONTENT:
            if not self._tools:
                self._take(len(held), Kind.CONTENT)
                return False
            return self._until(TOOL_CALL_START, Kind.CONTENT, final)
        if self._mode is _Mode.TOOL:
            return self._tool_call(final)
        return self._after_tool(final)

    def _until(self, delimiter: str, kind: Kind, final: bool) -> bool:
        """Text of `kind` up to `delimiter`; a possible start of the delimiter waits."""
        found = self._held.find(delimiter)
        if found < 0:
            keep = 0 if final else held_prefix(self._held, delimiter)
            self._take(len(self._held) - keep, kind)
            return False
        self._take(found, kind)
        if delimiter == TOOL_CALL_START:
            self._mode = _Mode.TOOL  # the start string stays held with the call
        else:
            self._take(len(delimiter), Kind.DELIMITER)
            self._mode = _Mode.AFTER_REASONING
        return True

    def _tool_call(self, final: bool) -> bool:
        held = self._held
        end = held.find(TOOL_CALL_END, len(TOOL_CALL_START))
        if end < 0:
            if final:  # a call cut short is what the model wrote: content
                self._take(len(held), Kind.CONTENT)
            return False
        body = held[len(TOOL_CALL_START) : end]
        call = parse_call(body)
        if call is None:
            self._take(end + len(TOOL_CALL_END), Kind.CONTENT)
            self._mode = _Mode.CONTENT
            return True
        name, arguments = call
        self._take(len(TOOL_CALL_START), Kind.DELIMITER)
        self._take(len(body), Kind.TOOL)
        self._take(len(TOOL_CALL_END), Kind.DELIMITER)
        self._new_calls.append(ToolCallDelta(self._calls, arguments, new_call_id(), name))
        self._calls += 1
        self._mode = _Mode.AFTER_TOOL
        return True

    def _after_tool(self, final: bool) -> bool:
        held = self._held
        space = leading_space(held)
        rest = held[space:]
        if rest.startswith(TOOL_CALL_START):
            self._take(space, Kind.STRIPPED)
            self._mode = _Mode.TOOL
            return True
        if not final and TOOL_CALL_START.startswith(rest):
            return False  # only whitespace, or what may become the next call, so far
        if not rest:
            self._take(space, Kind.STRIPPED)
            return False
        self._mode = _Mode.CONTENT  # text after the calls, its whitespace included
        return True

    def _take(self, length: int, kind: Kind) -> None:
        """Classifies the next `length` held characters as `kind`."""
        if length == 0:
            return
        text, self._held = self._held[:length], self._held[length:]
        if kind is Kind.CONTENT:
            start = self._position
            self._ranges.append((start, start + length, self._content_length))
            self._content_length += length
        elif kind is Kind.REASONING:
            start = self._position
            if self._reasoning and self._reasoning[-1][1] == start:
                start = self._reasoning.pop()[0]  # one range however the text arrived
            self._reasoning.append((start, self._position + length))
        if kind in self._out:
            self._out[kind].append(text)
        self._position += length
        self._last_kind = kind

    def _release(self, final: bool) -> tuple[LogprobEntry, ...]:
        """The entries of tokens whose first character is classified, those in content moved
        to content offsets; at the end, a token with no text of its own follows the text's
        last part."""
        released: list[LogprobEntry] = []
        while self._pending and (final or self._pending[0].text_offset < self._position):
            entry = self._pending.popleft()
            offset = entry.text_offset
            while self._ranges and self._ranges[0][1] <= offset:
                self._ranges.popleft()
            if offset >= self._position:
                if self._last_kind is Kind.CONTENT:
                    released.append(LogprobEntry(entry.position, self._content_length))
            elif self._ranges and self._ranges[0][0] <= offset:
                start, _, content_start = self._ranges[0]
                released.append(LogprobEntry(entry.position, content_start + offset - start))
        # Later entries start at or after the text fed so far: passed ranges are done with.
        horizon = self._pending[0].text_offset if self._pending else self._position
        while self._ranges and self._ranges[0][1] <= horizon:
            self._ranges.popleft()
        return tuple(released)

    def _count_reasoning(self, final: bool) -> int:
        """The number of tokens, among those whose first character is now classified, that
        start in reasoning. At the end, a token with no text of its own (a terminating EOS)
        is reasoning when the block is still open, as vLLM counts every token after the start
        marker until the end marker."""
        count = 0
        offsets, ranges = self._offsets, self._reasoning
        while offsets and (final or offsets[0] < self._position):
            offset = offsets.popleft()
            while ranges and ranges[0][1] <= offset:
                ranges.popleft()
            if offset >= self._position:
                inside = self._mode is _Mode.REASONING
            else:
                inside = bool(ranges) and ranges[0][0] <= offset
            count += 1 if inside else 0
        # Later tokens start at or after the text fed so far: passed ranges are done with.
        horizon = offsets[0] if offsets else self._position
        while ranges and ranges[0][1] <= horizon:
            ranges.popleft()
        return count
