"""What an output parser makes of a choice's deltas: reasoning, content with its entries, calls.

For the Responses API (and chat): build one parser per choice with
`choice_parser(index, config)` (`domain.parsers.build`), feed it every `ChoiceDelta` of that
choice in order, and use the returned `ParsedDelta`s instead of the raw deltas. Under a forced
tool call (`config.forced`) the content is the calls' JSON: it comes out as `tool_calls`
deltas, with no content and no content entries (`domain.parsers.forced`). The delta with a
`finish_reason` flushes the parser, so its `ParsedDelta` carries whatever was held back.
`content_logprobs` are exactly the entries of tokens whose first character lies in content;
their `text_offset` is an offset into the concatenated `content` (not into the raw text), so
their texts concatenate to the content. With no parser configured (`ParserConfig()`), content,
entries and offsets pass through unchanged. A `ParsedDelta` may be empty (everything held
back); skip it when streaming.

`reasoning_tokens` counts the tokens, released with this delta, whose first character lies in
reasoning text (the markers' tokens and the whitespace stripped after the end are not
reasoning); at the end a token with no text of its own (a terminating EOS) counts when the
block is still open. It is read from the deltas' `text_offsets`, so it needs no logprobs;
summed over a choice's deltas it is the same however the output was split, and 0 without a
reasoning parser.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from domain.emission.entries import Part, part_keeps
from domain.emission.outputs import ChoiceDelta, LogprobEntry
from domain.structured.tool_calls import ToolCallDelta, ToolCallMode

REASONING_PARSERS = ("deepseek_r1", "qwen3")
TOOL_CALL_PARSERS = ("hermes",)


@dataclass(frozen=True, slots=True)
class ParsedDelta:
    """New reasoning, content and tool-call text of one choice, with the content's entries."""

    index: int
    reasoning: str = ""
    content: str = ""
    content_logprobs: tuple[LogprobEntry, ...] = ()
    tool_calls: tuple[ToolCallDelta, ...] = ()
    token_ids: tuple[int, ...] = ()
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    reasoning_tokens: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def empty(self) -> bool:
        """Nothing for a consumer to show (token IDs alone are not shown)."""
        return not (self.reasoning or self.content or self.tool_calls or self.finished)


@dataclass(frozen=True, slots=True)
class ParserConfig:
    """Which parsers a choice's output goes through; valid names only.

    `prompt_in_reasoning` says the prompt (or chat template) already opened the reasoning
    block, so the output starts inside it. `tools` is whether tool calls are parsed at all
    (a request with `tools` and `tool_choice: "auto"` on a server with auto tool choice).
    `forced` is the request's forced tool call (`tool_choice` required or a named function),
    whose output's content is the calls' JSON.
    """

    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    tools: bool = False
    prompt_in_reasoning: bool = False
    reasoning_start: str = "<think>"
    reasoning_end: str = "</think>"
    forced: ToolCallMode | None = None

    def __post_init__(self) -> None:
        if self.reasoning_parser not in (None, *REASONING_PARSERS):
            raise ValueError(f"unknown reasoning parser {self.reasoning_parser!r}")
        if self.tool_call_parser not in (None, *TOOL_CALL_PARSERS):
            raise ValueError(f"unknown tool-call parser {self.tool_call_parser!r}")
        if not self.reasoning_start or not self.reasoning_end:
            raise ValueError("reasoning start and end strings must not be empty")

    @property
    def segments(self) -> bool:
        """Whether a reasoning or tool-call parser splits the text."""
        return self.reasoning_parser is not None or (
            self.tools and self.tool_call_parser is not None
        )

    @property
    def parses(self) -> bool:
        """Whether the deltas change at all: a parser splits them, or a forced tool call turns
        their content into calls; otherwise they pass through unchanged."""
        return self.segments or self.forced is not None


class ChoiceParser(Protocol):
    """Turns one choice's deltas, in order, into parsed deltas; the finishing delta flushes."""

    def feed(self, delta: ChoiceDelta) -> ParsedDelta: ...


class PassThrough:
    """No parser: the text is all content, whose entries keep their offsets."""

    def feed(self, delta: ChoiceDelta) -> ParsedDelta:
        return ParsedDelta(
            delta.index,
            content=delta.text,
            content_logprobs=delta.logprobs if part_keeps(Part.CONTENT) else (),
            token_ids=delta.token_ids,
            finish_reason=delta.finish_reason,
            stop_reason=delta.stop_reason,
        )
