"""Responses through the output parsers over the tiny model with marker tokens: reasoning
items, function calls found by the hermes parser, and output-text entries for content only."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator

import pytest

from adapters.http.app import create_app
from adapters.http.serving import ModelHolder, ServedModel
from domain.parsers.settings import ParserSettings
from tests.integration.http.conftest import serve_tiny
from tests.support import http_json
from tests.support.asgi_stream import stream_post
from tests.support.sse import named_events
from tests.support.tiny_serving import build_marker_model_dir

pytestmark = pytest.mark.model

CALL = {"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}
# Outputs are steered with a one-choice grammar; its logprobs stay the model's raw values.
THOUGHT = "<think>the fox</think>\n\nover the dog"
CALLING = (
    f"<think>hm</think>new slot<tool_call>{json.dumps(CALL)}</tool_call>\n"
    '<tool_call>{"name": "now"}</tool_call>'
)
TOOLS = [{"type": "function", "name": "get_weather"}, {"type": "function", "name": "now"}]
FINAL_USAGE = b'"usage": {"input_tokens"'


@pytest.fixture(scope="module")
def marker_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedModel]:
    model = serve_tiny(
        build_marker_model_dir(tmp_path_factory.mktemp("markers")), max_model_len=256
    )
    yield model
    model.stop()


@pytest.fixture(scope="module")
def plain(marker_served):
    return create_app(ModelHolder(served=marker_served))


@pytest.fixture(scope="module")
def parsing(marker_served):
    # The steering grammar spells the reasoning too, as vLLM's `enable_in_reasoning` allows.
    parsers = ParserSettings(
        "deepseek_r1", "hermes", auto_tool_choice=True, grammar_in_reasoning=True
    )
    return create_app(ModelHolder(served=dataclasses.replace(marker_served, parsers=parsers)))


def steered(text: str, **body: object) -> dict:
    return {
        "input": "the quick brown fox",
        "max_output_tokens": 200,
        "include": ["message.output_text.logprobs"],
        "top_logprobs": 2,
        "structured_outputs": {"choice": [text]},
        **body,
    }


def create(app, body: dict) -> dict:
    return http_json.post(app, "/v1/responses", body)


def events(app, body: dict) -> list[dict]:
    _, text = stream_post(app, "/v1/responses", json={**body, "stream": True}, until=FINAL_USAGE)
    return named_events(text)


def items(response: dict, kind: str) -> list[dict]:
    return [item for item in response["output"] if item["type"] == kind]


def entries(response: dict) -> list[dict]:
    return [e for item in items(response, "message") for e in item["content"][0]["logprobs"]]


def entry_bytes(found: list[dict]) -> bytes:
    return b"".join(bytes(e["bytes"]) for e in found)


def test_reasoning_is_its_own_item_and_only_answer_tokens_have_entries(parsing, plain):
    answer = create(parsing, steered(THOUGHT))
    raw = create(plain, steered(THOUGHT))

    reasoning, message = answer["output"]
    assert reasoning["type"] == "reasoning"
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "the fox"}]
    assert message["content"][0]["text"] == "over the dog"
    found = entries(answer)
    assert entry_bytes(found) == b"over the dog"
    # The same tokens, with the same values, as without a parser: nothing is recomputed.
    assert found == entries(raw)[-len(found) :]
    assert all(e["token"] not in ("<think>", "</think>") for e in found)
    assert answer["usage"]["output_tokens"] == raw["usage"]["output_tokens"]


def test_a_reasoning_stream_tells_the_same_items_and_entries(parsing):
    body = steered(THOUGHT, seed=5)
    whole = create(parsing, body)

    stream = events(parsing, body)

    reasoning = "".join(e["delta"] for e in stream if e["type"] == "response.reasoning_text.delta")
    text = "".join(e["delta"] for e in stream if e["type"] == "response.output_text.delta")
    streamed = [
        x for e in stream if e["type"] == "response.output_text.delta" for x in e["logprobs"]
    ]
    assert reasoning == "the fox" and text == "over the dog"
    assert streamed == entries(whole)
    assert stream[-1]["type"] == "response.completed"
    assert stream[-1]["response"]["output"][1]["content"] == whole["output"][1]["content"]


def test_auto_tool_choice_answers_with_function_calls_after_the_content(parsing):
    answer = create(parsing, steered(CALLING, tools=TOOLS, tool_choice="auto"))

    assert [item["type"] for item in answer["output"]] == [
        "reasoning",
        "message",
        "function_call",
        "function_call",
    ]
    calls = items(answer, "function_call")
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        ("get_weather", CALL["arguments"]),
        ("now", {}),
    ]
    assert all(c["call_id"] and c["id"].startswith("fc_") for c in calls)
    # Only the content tokens: tool data and the markers have no entries.
    assert entry_bytes(entries(answer)) == b"new slot"


def test_a_tool_call_stream_tells_the_same_calls_and_keeps_content_entries(parsing):
    body = steered(CALLING, tools=TOOLS, seed=2)
    whole = create(parsing, body)

    stream = events(parsing, body)

    done = [e for e in stream if e["type"] == "response.function_call_arguments.done"]
    assert [e["arguments"] for e in done] == [c["arguments"] for c in items(whole, "function_call")]
    streamed = [
        x for e in stream if e["type"] == "response.output_text.delta" for x in e["logprobs"]
    ]
    assert streamed == entries(whole)
    final = stream[-1]["response"]
    assert [i["type"] for i in final["output"]] == [i["type"] for i in whole["output"]]


def test_a_follow_up_sends_the_calls_back_through_the_template(parsing, marker_served):
    first = create(parsing, steered(CALLING, tools=TOOLS))
    call = items(first, "function_call")[0]

    follow = create(
        parsing,
        {
            "previous_response_id": first["id"],
            "input": [
                {"type": "function_call_output", "call_id": call["call_id"], "output": "sun"}
            ],
            "tools": TOOLS,
            "tool_choice": "none",
            "max_output_tokens": 1,
        },
    )

    assert follow["status"] in ("completed", "incomplete")
    assert follow["usage"]["input_tokens"] > first["usage"]["input_tokens"]


@pytest.fixture(scope="module")
def qwen(marker_served):
    parsers = ParserSettings("qwen3", grammar_in_reasoning=True)
    return create_app(ModelHolder(served=dataclasses.replace(marker_served, parsers=parsers)))


def generated_ids(plain, body: dict) -> list[int]:
    """The output's token IDs, read from a parserless answer's entries (every output token but
    a terminating EOS has one); greedy, so the parsing answer chose the same tokens."""
    answer = create(plain, {**body, "return_tokens_as_token_ids": True})
    return [int(e["token"].removeprefix("token_id:")) for e in entries(answer)]


def between_markers(served: ServedModel, token_ids: list[int], *, opened: bool) -> int:
    """vLLM's count: the tokens after the start marker (from the first token when the output
    starts inside the block) up to the end marker or the output's end."""
    pieces = [served.tokenizer.token_bytes(t) for t in token_ids]
    start = pieces.index(b"<think>") + 1 if b"<think>" in pieces else 0 if opened else None
    if start is None:
        return 0
    end = pieces.index(b"</think>") if b"</think>" in pieces else len(pieces)
    return end - start


def reasoning_tokens(response: dict) -> int:
    return response["usage"]["output_tokens_details"]["reasoning_tokens"]


def test_reasoning_tokens_are_the_tokens_between_the_markers(parsing, plain, marker_served):
    body = steered(THOUGHT, temperature=0)

    answer = create(parsing, body)

    expected = between_markers(marker_served, generated_ids(plain, body), opened=True)
    assert expected > 0
    assert reasoning_tokens(answer) == expected
    # Without a reasoning parser there is no reasoning, whatever the text holds.
    assert reasoning_tokens(create(plain, body)) == 0


def test_a_reasoning_stream_reports_the_same_reasoning_tokens_as_the_whole_answer(parsing):
    body = steered(THOUGHT, temperature=0)
    whole = create(parsing, body)

    stream = events(parsing, body)

    assert stream[-1]["type"] == "response.completed"
    assert reasoning_tokens(stream[-1]["response"]) == reasoning_tokens(whole) > 0


def test_a_block_cut_off_by_the_token_limit_counts_every_token_after_the_start(
    parsing, plain, marker_served
):
    body = steered("<think>the quick brown fox jumps</think>ok", temperature=0)
    body["max_output_tokens"] = 4

    answer = create(parsing, body)
    streamed = events(parsing, body)[-1]["response"]

    assert answer["status"] == "incomplete"
    expected = between_markers(marker_served, generated_ids(plain, body), opened=True)
    assert reasoning_tokens(answer) == reasoning_tokens(streamed) == expected
    assert expected == answer["usage"]["output_tokens"] - 1


def test_deepseek_r1_counts_reasoning_from_the_first_token_without_a_start_marker(
    parsing, plain, marker_served
):
    body = steered("the fox</think>over the dog", temperature=0)

    answer = create(parsing, body)

    assert items(answer, "reasoning")[0]["content"][0]["text"] == "the fox"
    expected = between_markers(marker_served, generated_ids(plain, body), opened=True)
    assert reasoning_tokens(answer) == expected > 0


def test_qwen3_reports_no_reasoning_tokens_for_output_without_a_start_marker(
    qwen, plain, marker_served
):
    unopened = steered("the fox</think>over the dog", temperature=0)
    opened = steered(THOUGHT, temperature=0)

    assert reasoning_tokens(create(qwen, unopened)) == 0
    expected = between_markers(marker_served, generated_ids(plain, opened), opened=False)
    assert reasoning_tokens(create(qwen, opened)) == expected > 0
