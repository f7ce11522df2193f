"""Structured outputs through the Falcon app over the tiny model: valid outputs, raw logprobs,
forced tool calls, and the 400s before admission."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from tests.support.asgi_stream import stream_post
from tests.support.sse import json_frames

pytestmark = pytest.mark.model

MESSAGES = [{"role": "user", "content": "the quick brown fox"}]
# FP32 `logit - lse` against float64 log_softmax of transformers' FP32 logits.
TOLERANCE = 2e-5
SCHEMA = {
    "type": "object",
    "properties": {
        "size": {"type": "integer", "minimum": 1, "maximum": 99},
        "colour": {"enum": ["red", "green"]},
        "code": {"type": "string", "pattern": "^[a-f]{2,4}$"},
        "flags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
    },
    "required": ["size", "colour", "code", "flags"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"enum": ["Paris", "Oslo"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
NOW = {"type": "function", "function": {"name": "now"}}


def chat(client, **body):
    return client.simulate_post(
        "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 80, **body}
    )


def complete(client, **body):
    return client.simulate_post(
        "/v1/completions", json={"prompt": "the quick brown", "max_tokens": 80, **body}
    )


@pytest.mark.parametrize("seed", range(4))
def test_a_json_schema_response_format_gives_json_the_schema_accepts(client, seed):
    response_format = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA}}

    body = chat(client, response_format=response_format, seed=seed).json

    (choice,) = body["choices"]
    assert choice["finish_reason"] == "stop"
    jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)


def test_json_object_gives_a_json_object_on_completions_too(client):
    body = complete(client, response_format={"type": "json_object"}, seed=1, max_tokens=100).json

    text = body["choices"][0]["text"]
    if body["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(text), dict)
    else:
        assert text.startswith("{")


@pytest.mark.parametrize(
    ("constraint", "check"),
    [
        ({"regex": "[a-e]{3}-[0-9]{2}"}, lambda t: re.fullmatch("[a-e]{3}-[0-9]{2}", t)),
        (
            {"choice": ["quick fox", "slow dog", "cat"]},
            lambda t: t in {"quick fox", "slow dog", "cat"},
        ),
        ({"grammar": 'root ::= "go " [0-9] [0-9]?'}, lambda t: re.fullmatch("go [0-9]{1,2}", t)),
        ({"grammar": 'start: "a" ("b" | "c")+ "."'}, lambda t: re.fullmatch("a[bc]+\\.", t)),
    ],
)
def test_structured_outputs_regex_choice_and_grammar_constrain_every_choice(
    client, constraint, check
):
    body = complete(client, structured_outputs=constraint, n=3, temperature=1.0, seed=5).json

    for choice in body["choices"]:
        assert choice["finish_reason"] == "stop", choice
        assert check(choice["text"]), choice["text"]


def test_constrained_entries_are_the_unmasked_model_distribution(client, served, reference):
    prompt = served.tokenizer.encode("the quick brown", add_special_tokens=False)
    body = complete(
        client,
        prompt=prompt,
        structured_outputs={"regex": "[0-9]{6}"},
        logprobs=3,
        temperature=0,
        max_tokens=10,
        return_tokens_as_token_ids=True,
    ).json

    logprobs = body["choices"][0]["logprobs"]
    chosen = [int(t.removeprefix("token_id:")) for t in logprobs["tokens"]]
    rows = reference(prompt + chosen)[len(prompt) - 1 :]
    masked_away = 0
    for position, token_id in enumerate(chosen):
        row = rows[position]
        assert logprobs["token_logprobs"][position] == pytest.approx(
            float(row[token_id]), abs=TOLERANCE
        )
        alternatives = {
            int(k.removeprefix("token_id:")): v
            for k, v in logprobs["top_logprobs"][position].items()
        }
        top = row.topk(3)
        for value, token in zip(top.values.tolist(), top.indices.tolist(), strict=True):
            assert alternatives[token] == pytest.approx(value, abs=TOLERANCE)
        masked_away += int(row.argmax()) != token_id
    assert re.fullmatch("[0-9]{6}", body["choices"][0]["text"])
    # The model's own favourites are mostly not digits: the mask changed the choice, not the values.
    assert masked_away > 0


def test_a_constrained_stream_concatenates_to_the_whole_answer(client, app):
    request = {
        "messages": MESSAGES,
        "max_tokens": 80,
        "n": 2,
        "seed": 3,
        "logprobs": True,
        "top_logprobs": 2,
        "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}},
    }
    whole = client.simulate_post("/v1/chat/completions", json=request).json

    _, text = stream_post(app, "/v1/chat/completions", json={**request, "stream": True})

    contents, entries = {0: "", 1: ""}, {0: [], 1: []}
    for chunk in json_frames(text):
        (choice,) = chunk["choices"]
        contents[choice["index"]] += choice["delta"].get("content", "")
        if choice["logprobs"]:
            entries[choice["index"]] += choice["logprobs"]["content"]
    for choice in whole["choices"]:
        assert contents[choice["index"]] == choice["message"]["content"]
        assert entries[choice["index"]] == choice["logprobs"]["content"]


def test_a_named_tool_choice_returns_its_arguments_as_a_tool_call(client):
    choice = {"type": "function", "function": {"name": "get_weather"}}

    body = chat(client, tools=[WEATHER, NOW], tool_choice=choice, seed=2).json

    (answer,) = body["choices"]
    assert answer["finish_reason"] == "tool_calls"
    assert answer["message"]["content"] is None
    (call,) = answer["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("chatcmpl-tool-")
    assert call["function"]["name"] == "get_weather"
    jsonschema.validate(
        json.loads(call["function"]["arguments"]), WEATHER["function"]["parameters"]
    )


@pytest.mark.parametrize("seed", range(3))
def test_required_tool_choice_without_parallel_calls_returns_one_call_of_a_listed_function(
    client, seed
):
    body = chat(
        client,
        tools=[WEATHER, NOW],
        tool_choice="required",
        parallel_tool_calls=False,
        seed=seed,
        max_tokens=90,
    ).json

    (answer,) = body["choices"]
    assert answer["finish_reason"] == "tool_calls", answer
    calls = answer["message"]["tool_calls"]
    assert len(calls) == 1
    for call in calls:
        arguments = json.loads(call["function"]["arguments"])
        if call["function"]["name"] == "get_weather":
            jsonschema.validate(arguments, WEATHER["function"]["parameters"])
        else:
            assert call["function"]["name"] == "now" and arguments == {}


def test_streamed_tool_calls_concatenate_to_the_whole_calls(client, app):
    request = {
        "messages": MESSAGES,
        "max_tokens": 90,
        "seed": 4,
        "tools": [WEATHER, NOW],
        "tool_choice": "required",
    }
    whole = client.simulate_post("/v1/chat/completions", json=request).json

    _, text = stream_post(app, "/v1/chat/completions", json={**request, "stream": True})

    calls: dict[int, dict] = {}
    finish = None
    for chunk in json_frames(text):
        (choice,) = chunk["choices"]
        finish = choice["finish_reason"] or finish
        for delta in choice["delta"].get("tool_calls", []):
            if "id" in delta:
                calls[delta["index"]] = {"name": delta["function"]["name"], "arguments": ""}
            calls[delta["index"]]["arguments"] += delta["function"]["arguments"]
    expected = [c["function"] for c in whole["choices"][0]["message"]["tool_calls"]]
    assert [calls[index] for index in sorted(calls)] == expected
    assert finish == whole["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"structured_outputs": {"regex": "(ab"}}, "structured_outputs", "unclosed group"),
        ({"structured_outputs": {"regex": "a(?=b)"}}, "structured_outputs", "look-around"),
        ({"structured_outputs": {"grammar": "start: foo"}}, "structured_outputs", "unknown name"),
        ({"structured_outputs": {"json": "{not json"}}, "structured_outputs", "not valid JSON"),
        (
            {"structured_outputs": {"regex": "a", "choice": ["b"]}},
            "structured_outputs",
            "exactly one",
        ),
        ({"structured_outputs": {"choice": []}}, "structured_outputs", "non-empty strings"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"if": {}}}}},
            "response_format",
            'Unimplemented keys: ["if"]',
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"schema": {"type": "frob"}},
                }
            },
            "response_format",
            "frob",
        ),
        ({"response_format": {"type": "yaml"}}, "response_format", "must be one of"),
        ({"response_format": {"type": "json_schema"}}, "response_format", "JSON schema object"),
        ({"response_format": "json"}, "response_format", "must be an object"),
        (
            {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
            "structured_outputs",
            "only one of",
        ),
        ({"tools": [WEATHER]}, "tool_choice", "auto"),
        ({"tools": [WEATHER], "tool_choice": "auto"}, "tool_choice", "auto"),
        ({"tool_choice": "required"}, "tool_choice", "needs `tools`"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
            "not in `tools`",
        ),
        (
            {
                "tools": [{"type": "function", "function": {"name": "a b"}}],
                "tool_choice": "required",
            },
            "tools",
            "letters",
        ),
        ({"tools": "x"}, "tools", "list of objects"),
    ],
)
def test_bad_constraints_are_a_400_naming_the_field_before_admission(
    client, served, served_steps, body, param, words
):
    scheduled = len(served_steps.observed("queue_times"))

    response = chat(client, **body)

    assert response.status_code == 400, response.json
    error = response.json["error"]
    assert error["param"] == param and words in error["message"], error
    # Never admitted: nothing queued or running, and no choice was ever scheduled.
    assert not served.engine.has_work()
    assert len(served_steps.observed("queue_times")) == scheduled
