"""Builds a Responses output from a choice's parsed deltas, as stream events and as the whole.

The non-streaming response is the one a stream ends with: both come from this one assembler,
so they hold the same items, text and entries.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from domain.common.wire import JsonObject
from domain.emission.outputs import LogprobEntry, Usage
from domain.parsers.parsed import ParsedDelta
from domain.presentation.objects import ResponseHeader
from domain.responses.objects import (
    ResponseEnd,
    ResponseSettings,
    output_text_part,
    reasoning_part,
    response_object,
)
from domain.structured.tool_calls import ToolCallDelta

# Renders output-text entries as the wire shows them; None when logprobs were not included.
EntryRenderer = Callable[[Sequence[LogprobEntry]], list[JsonObject]]

_PREFIXES = {"reasoning": "rs", "message": "msg", "function_call": "fc"}


@dataclass
class _Item:
    """One output item being built: reasoning text, message text or call arguments."""

    kind: str
    index: int
    id: str
    text: str = ""
    entries: list[JsonObject] = field(default_factory=list)
    call_id: str = ""
    name: str = ""
    status: str = "in_progress"

    def wire(self, *, opening: bool = False) -> JsonObject:
        """The item; when `opening` (output_item.added) a message or reasoning item has no
        content part yet."""
        if self.kind == "function_call":
            return {
                "type": "function_call",
                "id": self.id,
                "call_id": self.call_id,
                "name": self.name,
                "arguments": self.text,
                "status": self.status,
            }
        content = [] if opening else [self.part()]
        if self.kind == "reasoning":
            return {
                "type": "reasoning",
                "id": self.id,
                "summary": [],
                "content": content,
                "status": self.status,
            }
        return {
            "type": "message",
            "id": self.id,
            "role": "assistant",
            "status": self.status,
            "content": content,
        }

    def part(self, *, empty: bool = False) -> JsonObject:
        text = "" if empty else self.text
        if self.kind == "reasoning":
            return reasoning_part(text)
        return output_text_part(text, [] if empty else list(self.entries))


class ResponseAssembler:
    """Turns one choice's parsed deltas into output items and sequence-numbered events.

    Items follow the output's order: reasoning text goes to a reasoning item, content to a
    message item with one `output_text` part, each tool call to a `function_call` item; a new
    kind of text closes the open item. Output-text entries are only the parsed content's
    entries (reasoning, tool data and delimiters have none); a forced tool call's JSON comes
    already parsed into calls (`domain.parsers.forced`). The usage's reasoning tokens are the
    sum of the parsed deltas' counts, so a stream and the whole answer report the same.
    """

    def __init__(
        self,
        header: ResponseHeader,
        settings: ResponseSettings,
        *,
        entries: EntryRenderer | None = None,
    ) -> None:
        self._header = header
        self._settings = settings
        self._render = entries
        self._items: list[_Item] = []
        self._open: _Item | None = None
        self._calls: dict[int, _Item] = {}
        self._sequence = 0
        self._reasoning_tokens = 0
        self._finish_reason: str | None = None
        self._end: ResponseEnd | None = None

    def response(self) -> JsonObject:
        """The response as it stands: in progress until `finish` or `fail`."""
        output = [item.wire() for item in self._items]
        return response_object(self._header, self._settings, output, self._end)

    def start(self) -> list[JsonObject]:
        return [
            self._event("response.created", response=self.response()),
            self._event("response.in_progress", response=self.response()),
        ]

    def feed(self, parsed: ParsedDelta) -> list[JsonObject]:
        events: list[JsonObject] = []
        self._reasoning_tokens += parsed.reasoning_tokens
        if parsed.reasoning:
            self._reasoning(parsed.reasoning, events)
        if parsed.content or parsed.content_logprobs:
            self._content(parsed.content, parsed.content_logprobs, events)
        for call in parsed.tool_calls:
            self._call(call, events)
        if parsed.finished:
            self._finish_reason = parsed.finish_reason
        return events

    def finish(self, usage: Usage) -> list[JsonObject]:
        """Closes the open item and ends the response: `incomplete` when the output ran into
        its token limit, `completed` otherwise."""
        cut = self._finish_reason == "length"
        events: list[JsonObject] = []
        self._close(events, "incomplete" if cut else "completed")
        self._end = ResponseEnd(
            "incomplete" if cut else "completed",
            usage,
            self._reasoning_tokens,
            incomplete_reason="max_output_tokens" if cut else None,
        )
        kind = "response.incomplete" if cut else "response.completed"
        events.append(self._event(kind, response=self.response()))
        return events

    def fail(self, message: str, usage: Usage) -> list[JsonObject]:
        """Ends the response as failed; items stay as far as they got."""
        self._end = ResponseEnd("failed", usage, self._reasoning_tokens, error=message)
        return [self._event("response.failed", response=self.response())]

    def _event(self, kind: str, **fields: object) -> JsonObject:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def _item(self, kind: str, events: list[JsonObject]) -> _Item:
        """The open item of `kind`, or a new one (closing the open item of another kind)."""
        if self._open is not None and self._open.kind == kind and kind != "function_call":
            return self._open
        self._close(events, "completed")
        index = len(self._items)
        item = _Item(kind, index, f"{_PREFIXES[kind]}_{uuid.uuid4().hex}")
        self._items.append(item)
        self._open = item
        events.append(
            self._event(
                "response.output_item.added", output_index=index, item=item.wire(opening=True)
            )
        )
        if kind != "function_call":
            events.append(self._part_event("response.content_part.added", item, empty=True))
        return item

    def _item_event(self, kind: str, item: _Item, **fields: object) -> JsonObject:
        """An event about `item`; one about a message or reasoning item names its one part."""
        where: JsonObject = {"item_id": item.id, "output_index": item.index}
        if item.kind != "function_call":
            where["content_index"] = 0
        return self._event(kind, **where, **fields)

    def _part_event(self, kind: str, item: _Item, *, empty: bool = False) -> JsonObject:
        return self._item_event(kind, item, part=item.part(empty=empty))

    def _reasoning(self, text: str, events: list[JsonObject]) -> None:
        item = self._item("reasoning", events)
        item.text += text
        events.append(self._item_event("response.reasoning_text.delta", item, delta=text))

    def _content(
        self, text: str, entries: Sequence[LogprobEntry], events: list[JsonObject]
    ) -> None:
        item = self._item("message", events)
        item.text += text
        rendered = self._render(entries) if self._render is not None else []
        item.entries.extend(rendered)
        events.append(
            self._item_event("response.output_text.delta", item, delta=text, logprobs=rendered)
        )

    def _call(self, call: ToolCallDelta, events: list[JsonObject]) -> None:
        if call.id is not None:
            opened = self._item("function_call", events)
            opened.call_id, opened.name = call.id, call.name or ""
            self._calls[call.index] = opened
        item = self._calls.get(call.index)
        if item is None or item is not self._open:
            raise ValueError(f"arguments of tool call {call.index}, which is not open")
        if call.arguments:
            item.text += call.arguments
            events.append(
                self._item_event(
                    "response.function_call_arguments.delta", item, delta=call.arguments
                )
            )

    def _close(self, events: list[JsonObject], status: str) -> None:
        item, self._open = self._open, None
        if item is None:
            return
        item.status = status
        if item.kind == "function_call":
            done = self._item_event(
                "response.function_call_arguments.done", item, arguments=item.text
            )
        elif item.kind == "reasoning":
            done = self._item_event("response.reasoning_text.done", item, text=item.text)
        else:
            done = self._item_event(
                "response.output_text.done", item, text=item.text, logprobs=list(item.entries)
            )
        events.append(done)
        if item.kind != "function_call":
            events.append(self._part_event("response.content_part.done", item))
        events.append(
            self._event("response.output_item.done", output_index=item.index, item=item.wire())
        )
