"""Structured outputs on a reasoning server, over the tiny model whose chat template opens
`<think>`: the reasoning is free text, the grammar starts after `</think>` (written by the model
or forced by the thinking budget), so the content is the grammar's output and only its tokens
have entries, whole, streamed and in Responses.

logit_bias steers where the block ends: -100 on both markers keeps the model from closing it
(the budget closes it), a raise on `</think>` makes the model close it by itself. It changes
sampling only, never the reported values.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator

import pytest

from adapters.cli.serve_config import ServeConfig
from adapters.http.app import create_app
from adapters.http.serving import ModelHolder, ServedModel
from tests.integration.http.conftest import parser_app, serve_tiny
from tests.support.asgi_stream import stream_post
from tests.support.http_json import post
from tests.support.sse import json_frames, named_events
from tests.support.tiny_serving import build_thinking_model_dir

pytestmark = pytest.mark.model

MESSAGES = [{"role": "user", "content": "the quick brown fox"}]
SCHEMA = {
    "type": "object",
    "properties": {"colour": {"enum": ["red", "green"]}, "ok": {"type": "boolean"}},
    "required": ["colour", "ok"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}}
FINAL_USAGE = b'"usage": {"input_tokens"'
IN_REASONING = '{"enable_in_reasoning": true}'


@pytest.fixture(scope="module")
def thinking_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedModel]:
    directory = build_thinking_model_dir(tmp_path_factory.mktemp("reasoning"))
    model = serve_tiny(directory, max_model_len=256)
    yield model
    model.stop()


@pytest.fixture(scope="module")
def app(thinking_served):
    return parser_app(thinking_served, reasoning_parser="qwen3")


@pytest.fixture(scope="module")
def markers(thinking_served) -> tuple[int, int]:
    encode = thinking_served.tokenizer.encode
    ((start,), (end,)) = (encode(s, add_special_tokens=False) for s in ("<think>", "</think>"))
    return start, end


@pytest.fixture(scope="module")
def closed_by_budget(markers) -> dict:
    """The model never writes a marker: the budget's forced end closes the block."""
    return {"logit_bias": {str(token): -100 for token in markers}}


@pytest.fixture(scope="module")
def closed_by_model(markers) -> dict:
    """The model writes `</think>` itself after a few free tokens (seeded draws)."""
    return {"logit_bias": {str(markers[0]): -100, str(markers[1]): 5}, "temperature": 1.0}


def valid(text: str) -> bool:
    value = json.loads(text)
    return (
        set(value) == {"colour", "ok"}
        and value["colour"] in ("red", "green")
        and isinstance(value["ok"], bool)
    )


def chat_body(steer: dict, **body: object) -> dict:
    return {
        "messages": MESSAGES,
        "max_tokens": 60,
        "seed": 3,
        "n": 2,
        "logprobs": True,
        "top_logprobs": 2,
        "response_format": RESPONSE_FORMAT,
        **steer,
        **body,
    }


def raw_completion(app, served: ServedModel, body: dict) -> dict:
    """The same prompt and draws through completions: the raw text and every token ID."""
    prompt = served.tokenizer.apply_chat_template(MESSAGES)
    fields = {k: v for k, v in body.items() if k not in ("messages", "logprobs", "top_logprobs")}
    return post(
        app,
        "/v1/completions",
        {**fields, "prompt": prompt, "logprobs": 0, "return_tokens_as_token_ids": True},
    )


def sampled_ids(logprobs: dict) -> list[int]:
    return [int(t.removeprefix("token_id:")) for t in logprobs["tokens"]]


@pytest.mark.parametrize("budget", [None, 4])
def test_chat_content_is_the_schemas_json_after_free_reasoning(
    app, thinking_served, closed_by_budget, closed_by_model, budget
):
    steer = closed_by_model if budget is None else closed_by_budget
    extra = {} if budget is None else {"thinking_token_budget": budget}
    body = chat_body(steer, **extra)

    answer = post(app, "/v1/chat/completions", body)
    raw = raw_completion(app, thinking_served, body)

    for choice, plain in zip(answer["choices"], raw["choices"], strict=True):
        message = choice["message"]
        assert choice["finish_reason"] == "stop"
        assert valid(message["content"]), message
        # The raw text: the free reasoning, one end string, then the grammar's output.
        assert plain["text"] == f"{message['reasoning']}</think>{message['content']}"
        if budget is not None:
            # The first `budget` sampled tokens are the reasoning; the forced end has no entry.
            sampled = sampled_ids(plain["logprobs"])
            decode = thinking_served.tokenizer.decode
            assert decode(sampled[:budget], skip_special_tokens=False) == message["reasoning"]
        # Entries for the content tokens only, with the values the same draws report raw.
        entries = choice["logprobs"]["content"]
        assert "".join(e["token"] for e in entries) == message["content"]
        assert [e["logprob"] for e in entries] == pytest.approx(
            plain["logprobs"]["token_logprobs"][-len(entries) :], abs=1e-6
        )
    assert any(choice["message"]["reasoning"] for choice in answer["choices"])


@pytest.mark.parametrize("budget", [None, 4])
def test_a_chat_stream_tells_the_same_reasoning_content_and_entries(
    app, closed_by_budget, closed_by_model, budget
):
    steer = closed_by_model if budget is None else closed_by_budget
    extra = {} if budget is None else {"thinking_token_budget": budget}
    body = chat_body(steer, **extra)
    whole = post(app, "/v1/chat/completions", body)

    _, text = stream_post(app, "/v1/chat/completions", json={**body, "stream": True})

    streamed: dict[int, dict] = {}
    for chunk in json_frames(text):
        for choice in chunk["choices"]:
            parts = streamed.setdefault(
                choice["index"], {"reasoning": "", "content": "", "entries": []}
            )
            parts["reasoning"] += choice["delta"].get("reasoning") or ""
            parts["content"] += choice["delta"].get("content") or ""
            parts["entries"] += (choice.get("logprobs") or {}).get("content") or []
    for choice in whole["choices"]:
        message = choice["message"]
        assert streamed[choice["index"]] == {
            "reasoning": message["reasoning"],
            "content": message["content"],
            "entries": choice["logprobs"]["content"],
        }


def responses_body(steer: dict, **body: object) -> dict:
    return {
        "input": "the quick brown fox",
        "max_output_tokens": 60,
        "seed": 3,
        "include": ["message.output_text.logprobs"],
        "top_logprobs": 2,
        "text": {"format": {"type": "json_schema", "name": "t", "schema": SCHEMA}},
        **steer,
        **body,
    }


def test_responses_give_a_reasoning_item_and_a_message_with_the_json(app, closed_by_model):
    # Responses take no thinking_token_budget; the model closes its reasoning itself.
    body = responses_body(closed_by_model)
    chat = post(app, "/v1/chat/completions", chat_body(closed_by_model, n=1))["choices"][0]

    answer = post(app, "/v1/responses", body)

    assert chat["message"]["reasoning"]
    assert [item["type"] for item in answer["output"]] == ["reasoning", "message"]
    message = answer["output"][1]["content"][0]
    assert message["text"] == chat["message"]["content"]
    assert valid(message["text"])
    thought = answer["output"][0]["content"][0]["text"]
    assert thought == chat["message"]["reasoning"]
    assert [e["logprob"] for e in message["logprobs"]] == pytest.approx(
        [e["logprob"] for e in chat["logprobs"]["content"]], abs=1e-6
    )
    _, text = stream_post(app, "/v1/responses", json={**body, "stream": True}, until=FINAL_USAGE)
    events = named_events(text)
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert "".join(e["delta"] for e in deltas) == message["text"]
    assert [x for e in deltas for x in e["logprobs"]] == message["logprobs"]


def test_enable_in_reasoning_makes_the_grammar_constrain_the_reasoning_too(thinking_served):
    config = ServeConfig(reasoning_parser="qwen3", structured_outputs_config=IN_REASONING)
    app = create_app(
        ModelHolder(served=dataclasses.replace(thinking_served, parsers=config.parsers))
    )
    body = {
        "messages": MESSAGES,
        "max_tokens": 20,
        "structured_outputs": {"choice": ["a</think>b"]},
    }

    message = post(app, "/v1/chat/completions", body)["choices"][0]["message"]

    assert (message["reasoning"], message["content"]) == ("a", "b")
    with pytest.raises(ValueError, match="unknown keys"):
        _ = ServeConfig(structured_outputs_config='{"backend": "xgrammar"}').parsers


def test_a_forced_tool_call_after_budgeted_reasoning_is_a_tool_call(app, closed_by_budget):
    tool = {
        "type": "function",
        "function": {"name": "rate", "parameters": SCHEMA},
    }
    body = chat_body(
        closed_by_budget,
        n=1,
        thinking_token_budget=3,
        tools=[tool],
        tool_choice={"type": "function", "function": {"name": "rate"}},
    )
    del body["response_format"]

    choice = post(app, "/v1/chat/completions", body)["choices"][0]

    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["reasoning"]
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "rate"
    assert valid(call["function"]["arguments"])
    # The arguments are tool JSON, not content: no entries.
    assert not (choice["logprobs"] or {}).get("content")
    _, text = stream_post(app, "/v1/chat/completions", json={**body, "stream": True})
    reasoning, arguments, finish = "", "", None
    for chunk in json_frames(text):
        for streamed in chunk["choices"]:
            reasoning += streamed["delta"].get("reasoning") or ""
            for delta in streamed["delta"].get("tool_calls") or []:
                arguments += delta["function"].get("arguments") or ""
            assert not (streamed.get("logprobs") or {}).get("content")
            finish = streamed["finish_reason"] or finish
    assert (reasoning, arguments) == (choice["message"]["reasoning"], call["function"]["arguments"])
    assert finish == "tool_calls"


def test_completions_follow_the_parsers_reading_of_the_prompt(thinking_served, closed_by_budget):
    deepseek = parser_app(thinking_served, reasoning_parser="deepseek_r1")
    qwen = parser_app(thinking_served, reasoning_parser="qwen3")
    word = {"structured_outputs": {"choice": ["brown fox"]}}
    body = {"prompt": "the quick", "max_tokens": 30, "seed": 5, **closed_by_budget}
    budget = {"thinking_token_budget": 2, "return_tokens_as_token_ids": True, "logprobs": 0}

    def text(app, **extra: object) -> dict:
        return post(app, "/v1/completions", {**body, **extra})["choices"][0]

    # deepseek_r1 reads any output as reasoning first: two free tokens, the forced end, then
    # the grammar; without a grammar the budget counts from the first token all the same.
    constrained = text(deepseek, **budget, **word)
    sampled = sampled_ids(constrained["logprobs"])
    decode = thinking_served.tokenizer.decode
    thought = decode(sampled[:2], skip_special_tokens=False)
    assert constrained["text"] == f"{thought}</think>brown fox"
    assert decode(sampled[2:], skip_special_tokens=True) == "brown fox"
    free = text(deepseek, **budget)
    assert free["text"].startswith(constrained["text"].split("</think>")[0] + "</think>")
    # qwen3 reads a prompt that opened no block as the answer: the grammar owns the output
    # from its first token, and the budget forces nothing into it.
    assert text(qwen, **budget, **word)["text"] == "brown fox"
