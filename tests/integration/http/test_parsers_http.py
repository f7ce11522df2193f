"""Chat through the output parsers over the tiny model with marker tokens: reasoning and tool
calls out of the text, content entries only for content tokens, streams equal to answers."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from falcon import testing

from adapters.http.app import create_app
from adapters.http.serving import ModelHolder, ServedModel
from domain.parsers.settings import ReasoningStrings
from tests.integration.http.conftest import parser_app, serve_tiny
from tests.support import http_json
from tests.support.asgi_stream import stream_post
from tests.support.sse import json_frames
from tests.support.tiny_serving import build_marker_model_dir

pytestmark = pytest.mark.model

MESSAGES = [{"role": "user", "content": "the quick brown fox"}]
CALL = {"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}
# Outputs are steered with a one-choice grammar; its logprobs stay the model's raw values.
THOUGHT = "<think>the fox</think>\n\nover the dog"
CALLING = (
    f"<think>hm</think>new slot<tool_call>{json.dumps(CALL)}</tool_call>\n"
    '<tool_call>{"name": "now"}</tool_call>'
)
WEATHER = {"type": "function", "function": {"name": "get_weather"}}
NOW = {"type": "function", "function": {"name": "now"}}


@pytest.fixture(scope="module")
def marker_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedModel]:
    directory = build_marker_model_dir(tmp_path_factory.mktemp("markers"))
    model = serve_tiny(directory, max_model_len=256)
    yield model
    model.stop()


def app_with(served: ServedModel, **settings: object):
    # The steering grammar spells the reasoning too, as vLLM's `enable_in_reasoning` allows.
    settings.setdefault("grammar_in_reasoning", True)
    return parser_app(served, **settings)


@pytest.fixture(scope="module")
def plain(marker_served):
    return create_app(ModelHolder(served=marker_served))


@pytest.fixture(scope="module")
def parsing(marker_served):
    return app_with(
        marker_served,
        reasoning_parser="deepseek_r1",
        tool_call_parser="hermes",
        auto_tool_choice=True,
    )


def steered(text: str, **body: object) -> dict:
    return {
        "messages": MESSAGES,
        "max_tokens": 200,
        "logprobs": True,
        "top_logprobs": 2,
        "structured_outputs": {"choice": [text]},
        **body,
    }


def post(app, body: dict) -> dict:
    return http_json.post(app, "/v1/chat/completions", body)


def streamed(app, body: dict) -> dict:
    """The stream's parts per choice, joined: reasoning, content, entries, calls, finish."""
    _, text = stream_post(app, "/v1/chat/completions", json={**body, "stream": True})
    joined: dict = {"reasoning": "", "content": "", "entries": [], "calls": {}, "finish": None}
    for chunk in json_frames(text):
        if not chunk["choices"]:
            continue
        (choice,) = chunk["choices"]
        delta = choice["delta"]
        assert delta.get("reasoning") == delta.get("reasoning_content")
        joined["reasoning"] += delta.get("reasoning") or ""
        joined["content"] += delta.get("content") or ""
        if choice["logprobs"]:
            joined["entries"] += choice["logprobs"]["content"]
        for call in delta.get("tool_calls", []):
            slot = joined["calls"].setdefault(call["index"], {"name": None, "arguments": ""})
            if "id" in call:
                slot["name"] = call["function"]["name"]
            slot["arguments"] += call["function"]["arguments"]
        joined["finish"] = choice["finish_reason"] or joined["finish"]
    return joined


def entry_text(entries: list[dict]) -> bytes:
    return b"".join(bytes(e["bytes"]) for e in entries)


def test_reasoning_is_split_out_and_only_answer_tokens_have_entries(parsing, plain):
    answer = post(parsing, steered(THOUGHT))
    raw = post(plain, steered(THOUGHT))

    message = answer["choices"][0]["message"]
    assert message["reasoning"] == message["reasoning_content"] == "the fox"
    assert message["content"] == "over the dog"
    entries = answer["choices"][0]["logprobs"]["content"]
    assert entry_text(entries) == b"over the dog"
    # The same tokens, with the same values, as without a parser: nothing is recomputed.
    assert entries == raw["choices"][0]["logprobs"]["content"][-len(entries) :]
    assert answer["usage"] == raw["usage"]


def test_a_reasoning_stream_equals_the_whole_answer(parsing):
    body = steered(THOUGHT, seed=5)
    whole = post(parsing, body)
    joined = streamed(parsing, body)

    message = whole["choices"][0]["message"]
    assert (joined["reasoning"], joined["content"]) == (message["reasoning"], message["content"])
    assert joined["entries"] == whole["choices"][0]["logprobs"]["content"]
    assert joined["finish"] == whole["choices"][0]["finish_reason"] == "stop"


def test_auto_tool_choice_parses_hermes_calls_after_content(parsing):
    body = steered(CALLING, tools=[WEATHER, NOW], tool_choice="auto")
    answer = post(parsing, body)

    choice = answer["choices"][0]
    calls = choice["message"]["tool_calls"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", CALL["arguments"]),
        ("now", {}),
    ]
    assert all(c["id"].startswith("chatcmpl-tool-") and c["type"] == "function" for c in calls)
    assert choice["message"]["content"] == "new slot"
    assert choice["finish_reason"] == "tool_calls"
    # Only the content tokens: tool data and the markers have no entries.
    assert entry_text(choice["logprobs"]["content"]) == b"new slot"


def test_a_tool_call_stream_equals_the_whole_answer_and_keeps_content_entries(parsing):
    # vLLM #37737 lost entries on chunks around <tool_call>: every content entry is streamed.
    body = steered(CALLING, tools=[WEATHER, NOW], seed=2)
    whole = post(parsing, body)["choices"][0]
    joined = streamed(parsing, body)

    assert joined["content"] == whole["message"]["content"]
    assert joined["entries"] == whole["logprobs"]["content"]
    assert [(c["name"], c["arguments"]) for c in joined["calls"].values()] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in whole["message"]["tool_calls"]
    ]
    assert joined["finish"] == "tool_calls"


def test_think_spans_get_no_entries_and_a_parser_drops_no_answer_entries(parsing, plain):
    # sglang #25055 reported entries for <think> spans; #28456 dropped them all with a parser.
    answer = post(parsing, steered(THOUGHT))["choices"][0]["logprobs"]["content"]
    raw = post(plain, steered(THOUGHT))["choices"][0]["logprobs"]["content"]

    tokens = [e["token"] for e in raw]
    answer_start = tokens.index("</think>") + 1
    assert "<think>" in tokens and len(answer) > 0
    assert all(e["token"] not in ("<think>", "</think>") for e in answer)
    # Every answer token after the stripped whitespace keeps its entry.
    while not raw[answer_start]["token"].strip():
        answer_start += 1
    assert answer == raw[answer_start:]


def test_without_a_parser_the_markers_stay_in_the_content(plain):
    answer = post(plain, steered(THOUGHT))["choices"][0]

    assert answer["message"]["content"] == THOUGHT
    assert "reasoning" not in answer["message"]


def test_qwen3_answers_without_a_start_string_are_content(marker_served):
    app = app_with(marker_served, reasoning_parser="qwen3")
    answer = post(app, steered("over the dog</think>"))["choices"][0]["message"]

    assert (answer["content"], answer["reasoning"]) == ("over the dog</think>", None)


def test_a_custom_reasoning_config_names_the_markers(marker_served):
    strings = ReasoningStrings("[[", "]]")
    app = app_with(marker_served, reasoning_parser="deepseek_r1", reasoning=strings)
    answer = post(app, steered("[[the fox]] over"))["choices"][0]["message"]

    assert (answer["reasoning"], answer["content"]) == ("the fox", "over")


def test_auto_tool_choice_without_the_flag_is_a_400(plain):
    result = testing.TestClient(plain).simulate_post(
        "/v1/chat/completions",
        json={"messages": MESSAGES, "tools": [NOW], "tool_choice": "auto"},
    )

    assert result.status_code == 400
    assert result.json["error"]["param"] == "tool_choice"
    assert "--enable-auto-tool-choice" in result.json["error"]["message"]
