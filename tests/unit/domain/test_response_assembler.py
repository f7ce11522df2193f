"""The Responses assembler: items in output order, numbered events, the same whole either way."""

from __future__ import annotations

from collections.abc import Sequence

from domain.emission.outputs import ChoiceDelta, LogprobEntry, Usage
from domain.logprobs.values import PositionLogprobs, TokenLogprob
from domain.parsers.build import choice_parser
from domain.parsers.parsed import ParsedDelta, ParserConfig
from domain.presentation.objects import ResponseHeader
from domain.responses.assembler import ResponseAssembler
from domain.responses.objects import ResponseSettings
from domain.structured.tool_calls import ToolCallDelta, ToolCallMode

HEADER = ResponseHeader("resp_1", 7, "m")


def make_entry(token_id: int, text_offset: int = 0) -> LogprobEntry:
    return LogprobEntry(PositionLogprobs(TokenLogprob(token_id, -0.5), ()), text_offset)


def render(entries: Sequence[LogprobEntry]) -> list[dict]:
    return [{"token": str(e.position.chosen.token_id)} for e in entries]


def make_assembler(**kwargs) -> ResponseAssembler:
    return ResponseAssembler(HEADER, ResponseSettings(), entries=render, **kwargs)


def test_reasoning_content_and_calls_become_items_in_output_order():
    assembler = make_assembler()
    events = assembler.start()
    events += assembler.feed(ParsedDelta(0, reasoning="hmm", reasoning_tokens=1))
    events += assembler.feed(ParsedDelta(0, content="Hi", content_logprobs=(make_entry(5),)))
    events += assembler.feed(
        ParsedDelta(0, tool_calls=(ToolCallDelta(0, '{"a": 1}', "call_1", "f"),))
    )
    events += assembler.feed(ParsedDelta(0, finish_reason="stop"))
    events += assembler.finish(Usage(3, 4))

    output = assembler.response()["output"]
    assert [item["type"] for item in output] == ["reasoning", "message", "function_call"]
    assert output[0]["content"] == [{"type": "reasoning_text", "text": "hmm"}]
    assert output[1]["content"][0]["logprobs"] == [{"token": "5"}]
    assert output[2]["arguments"] == '{"a": 1}' and output[2]["call_id"] == "call_1"
    assert all(item["status"] == "completed" for item in output)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["usage"]["output_tokens_details"] == {"reasoning_tokens": 1}


def test_each_item_is_closed_before_the_next_is_added():
    assembler = make_assembler()
    events = assembler.feed(ParsedDelta(0, reasoning="a"))
    events += assembler.feed(ParsedDelta(0, content="b"))

    kinds = [e["type"] for e in events]
    assert kinds == [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]


def test_a_length_finish_leaves_the_response_and_its_open_item_incomplete():
    assembler = make_assembler()
    assembler.feed(ParsedDelta(0, content="x", finish_reason="length"))

    events = assembler.finish(Usage(1, 1))

    response = events[-1]["response"]
    assert events[-1]["type"] == "response.incomplete"
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["output"][0]["status"] == "incomplete"


def test_a_forced_calls_parsed_output_becomes_call_items_without_entries():
    mode = ToolCallMode((("f", {"type": "object"}),), named="f")
    parser = choice_parser(0, ParserConfig(reasoning_parser="qwen3", forced=mode))
    assembler = make_assembler()

    assembler.feed(parser.feed(ChoiceDelta(0, '{"a"', (1,), logprobs=(make_entry(1),))))
    assembler.feed(parser.feed(ChoiceDelta(0, ": 2}", (2,), "stop", logprobs=(make_entry(2, 4),))))
    events = assembler.finish(Usage(1, 2))

    (call,) = assembler.response()["output"]
    assert call["type"] == "function_call" and call["name"] == "f"
    assert call["arguments"] == '{"a": 2}'
    assert not [e for e in events if e["type"].startswith("response.output_text")]


def test_without_a_renderer_entries_are_left_out():
    assembler = ResponseAssembler(HEADER, ResponseSettings())

    events = assembler.feed(ParsedDelta(0, content="x", content_logprobs=(make_entry(1),)))

    assert events[-1]["logprobs"] == []


def test_a_failure_reports_the_message_and_keeps_the_output_so_far():
    assembler = make_assembler()
    assembler.feed(ParsedDelta(0, content="x"))

    (event,) = assembler.fail("boom", Usage(1, 1))

    assert event["type"] == "response.failed"
    assert event["response"]["error"] == {"code": "server_error", "message": "boom"}
    assert event["response"]["output"][0]["content"][0]["text"] == "x"
