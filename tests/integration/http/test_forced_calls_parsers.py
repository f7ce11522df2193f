"""Forced tool calls (`tool_choice` required or named) through the output parsers over the tiny
marker model: chat, whole and streamed, and Responses give the calls the parserless server
gives, finish with `tool_calls`, and the calls' tokens have no content entries anywhere."""

from __future__ import annotations

import json
from collections.abc import Iterator

import jsonschema
import pytest

from adapters.http.app import create_app
from adapters.http.serving import ModelHolder, ServedModel
from tests.integration.http.conftest import parser_app, serve_tiny
from tests.support.asgi_stream import stream_post
from tests.support.http_json import post
from tests.support.sse import json_frames, named_events
from tests.support.tiny_serving import build_marker_model_dir

pytestmark = pytest.mark.model

MESSAGES = [{"role": "user", "content": "the quick brown fox"}]
PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Oslo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": PARAMETERS}}
NOW = {"type": "function", "function": {"name": "now"}}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
CHOICES = {"required": "required", "named": NAMED}
PARSERS = {
    "qwen3": {"reasoning_parser": "qwen3"},
    "hermes": {"tool_call_parser": "hermes", "auto_tool_choice": True},
    "qwen3+hermes": {
        "reasoning_parser": "qwen3",
        "tool_call_parser": "hermes",
        "auto_tool_choice": True,
    },
}
FINAL_USAGE = b'"usage": {"input_tokens"'


@pytest.fixture(scope="module")
def marker_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedModel]:
    directory = build_marker_model_dir(tmp_path_factory.mktemp("forced-markers"))
    model = serve_tiny(directory, max_model_len=256)
    yield model
    model.stop()


@pytest.fixture(scope="module")
def plain(marker_served):
    return create_app(ModelHolder(served=marker_served))


@pytest.fixture(scope="module", params=sorted(PARSERS))
def parsing(request, marker_served):
    return parser_app(marker_served, **PARSERS[request.param])


@pytest.fixture(scope="module")
def deepseek(marker_served):
    return parser_app(
        marker_served,
        reasoning_parser="deepseek_r1",
        tool_call_parser="hermes",
        auto_tool_choice=True,
    )


def forced(choice: str, **body: object) -> dict:
    return {
        "messages": MESSAGES,
        "max_tokens": 90,
        "seed": 3,
        "logprobs": True,
        "tools": [WEATHER, NOW],
        "tool_choice": CHOICES[choice],
        **body,
    }


def calls_of(message: dict) -> list[tuple[str, str]]:
    return [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]]


def check_calls(calls: list[tuple[str, str]], choice: str) -> None:
    assert calls, "no tool calls"
    if choice == "named":
        assert [name for name, _ in calls] == ["get_weather"]
    for name, arguments in calls:
        value = json.loads(arguments)
        if name == "get_weather":
            jsonschema.validate(value, PARAMETERS)
        else:
            assert (name, value) == ("now", {})


def streamed_chat(app, body: dict) -> dict:
    _, text = stream_post(app, "/v1/chat/completions", json={**body, "stream": True})
    joined: dict = {"reasoning": "", "content": "", "entries": [], "calls": {}, "finish": None}
    for chunk in json_frames(text):
        (choice,) = chunk["choices"]
        delta = choice["delta"]
        joined["reasoning"] += delta.get("reasoning") or ""
        joined["content"] += delta.get("content") or ""
        if choice["logprobs"]:
            joined["entries"] += choice["logprobs"]["content"]
        for call in delta.get("tool_calls", []):
            slot = joined["calls"].setdefault(call["index"], ["", ""])
            if "id" in call:
                assert call["id"].startswith("chatcmpl-tool-") and call["type"] == "function"
                slot[0] = call["function"]["name"]
            slot[1] += call["function"]["arguments"]
        joined["finish"] = choice["finish_reason"] or joined["finish"]
    return joined


def response_events(app, body: dict) -> list[dict]:
    _, text = stream_post(app, "/v1/responses", json={**body, "stream": True}, until=FINAL_USAGE)
    return named_events(text)


def responses_body(choice: str) -> dict:
    """The chat request `forced(choice)` as a Responses request (the same templated prompt)."""
    named = {"type": "function", "name": "get_weather"}
    tool_choice = "required" if choice == "required" else named
    return {
        "input": MESSAGES[0]["content"],
        "max_output_tokens": 90,
        "seed": 3,
        "include": ["message.output_text.logprobs"],
        "tools": [
            {"type": "function", "name": "get_weather", "parameters": PARAMETERS},
            {"type": "function", "name": "now"},
        ],
        "tool_choice": tool_choice,
    }


@pytest.mark.parametrize("choice", sorted(CHOICES))
def test_a_forced_call_under_parsers_is_the_call_the_parserless_server_gives(
    parsing, plain, choice
):
    answer = post(parsing, "/v1/chat/completions", forced(choice))["choices"][0]
    bare = post(plain, "/v1/chat/completions", forced(choice))["choices"][0]

    check_calls(calls_of(answer["message"]), choice)
    assert calls_of(answer["message"]) == calls_of(bare["message"])
    assert answer["message"]["content"] is None
    assert answer["message"].get("reasoning") is None
    assert answer["finish_reason"] == bare["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("choice", sorted(CHOICES))
def test_a_forced_calls_tokens_have_no_content_entries_with_or_without_parsers(
    parsing, plain, choice
):
    for app in (parsing, plain):
        answer = post(app, "/v1/chat/completions", forced(choice))["choices"][0]

        assert answer["message"]["tool_calls"]
        assert answer["logprobs"] == {"content": []}


@pytest.mark.parametrize("choice", sorted(CHOICES))
def test_a_streamed_forced_call_under_parsers_assembles_to_the_whole_answer(parsing, choice):
    whole = post(parsing, "/v1/chat/completions", forced(choice))["choices"][0]

    joined = streamed_chat(parsing, forced(choice))

    assert [tuple(joined["calls"][i]) for i in sorted(joined["calls"])] == calls_of(
        whole["message"]
    )
    assert (joined["reasoning"], joined["content"], joined["entries"]) == ("", "", [])
    assert joined["finish"] == whole["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("choice", sorted(CHOICES))
def test_a_forced_call_under_parsers_becomes_function_call_items_in_responses(
    parsing, plain, choice
):
    bare = post(plain, "/v1/chat/completions", forced(choice))["choices"][0]
    body = responses_body(choice)

    whole = post(parsing, "/v1/responses", body)
    stream = response_events(parsing, body)

    final = stream[-1]
    assert final["type"] == "response.completed"
    for response in (whole, final["response"]):
        assert [item["type"] for item in response["output"]] == ["function_call"] * len(
            bare["message"]["tool_calls"]
        )
        assert [(i["name"], i["arguments"]) for i in response["output"]] == calls_of(
            bare["message"]
        )
        assert response["status"] == "completed"
    assert not [e for e in stream if e["type"].startswith("response.output_text")]


def test_a_forced_call_cut_short_stays_content_in_a_whole_chat_answer(parsing, plain):
    body = forced("required", max_tokens=4)
    answer = post(parsing, "/v1/chat/completions", body)["choices"][0]
    bare = post(plain, "/v1/chat/completions", body)["choices"][0]

    assert answer["finish_reason"] == bare["finish_reason"] == "length"
    assert answer["message"]["tool_calls"] == bare["message"]["tool_calls"] == []
    assert answer["message"]["content"] == bare["message"]["content"]
    assert answer["message"]["content"].startswith("[")
    # Content, not a call: its tokens have their entries, the same as without a parser.
    assert answer["logprobs"] == bare["logprobs"]
    assert len(answer["logprobs"]["content"]) == 4


# deepseek_r1 answers start in reasoning, so a forced call can only follow the block's end:
# logit_bias makes the model write `</think>` after a few tokens, and the grammar starts after it.
END_BIAS = 5


@pytest.fixture(scope="module")
def end_bias(marker_served) -> dict[str, int]:
    (end,) = marker_served.tokenizer.encode("</think>", add_special_tokens=False)
    return {str(end): END_BIAS}


@pytest.mark.parametrize("choice", sorted(CHOICES))
def test_a_forced_call_after_deepseek_reasoning_is_a_call_and_the_reasoning_stays(
    deepseek, end_bias, choice
):
    body = forced(choice, logit_bias=end_bias)
    # The reasoning is sampled freely: the same as the unconstrained answer's.
    free = {k: v for k, v in body.items() if k not in ("tools", "tool_choice")}
    reasoning = post(deepseek, "/v1/chat/completions", free)["choices"][0]["message"]["reasoning"]
    assert reasoning

    answer = post(deepseek, "/v1/chat/completions", body)["choices"][0]
    joined = streamed_chat(deepseek, body)

    message = answer["message"]
    assert message["reasoning"] == reasoning
    check_calls(calls_of(message), choice)
    assert message["content"] is None
    assert answer["finish_reason"] == "tool_calls"
    assert answer["logprobs"] == {"content": []}
    assert joined["reasoning"] == reasoning
    assert [tuple(joined["calls"][i]) for i in sorted(joined["calls"])] == calls_of(message)
    assert (joined["content"], joined["entries"], joined["finish"]) == ("", [], "tool_calls")


@pytest.mark.parametrize("choice", sorted(CHOICES))
def test_a_forced_call_after_deepseek_reasoning_is_a_function_call_item_in_responses(
    deepseek, end_bias, choice
):
    body = {**responses_body(choice), "logit_bias": end_bias}
    free = post(
        deepseek,
        "/v1/responses",
        {k: v for k, v in body.items() if k not in ("tools", "tool_choice")},
    )
    reasoning = free["output"][0]
    assert reasoning["type"] == "reasoning" and reasoning["content"][0]["text"]

    whole = post(deepseek, "/v1/responses", body)
    final = response_events(deepseek, body)[-1]["response"]

    for response in (whole, final):
        assert response["status"] == "completed"
        assert response["output"][0]["content"] == reasoning["content"]
        calls = response["output"][1:]
        assert calls and {item["type"] for item in calls} == {"function_call"}
        check_calls([(i["name"], i["arguments"]) for i in calls], choice)
        assert response["usage"]["output_tokens_details"] == free["usage"]["output_tokens_details"]
    assert [(i["name"], i["arguments"]) for i in final["output"][1:]] == [
        (i["name"], i["arguments"]) for i in whole["output"][1:]
    ]
