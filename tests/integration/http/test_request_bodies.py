"""Declared request bodies: a 400 names the top-level field in `param` and the whole path in its
message, in the words of the field's declaration; what the declarations take stays taken."""

from __future__ import annotations

import json

import pytest

from tests.integration.http.test_errors import assert_error

pytestmark = pytest.mark.model

USER = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("path", "body", "param", "message"),
    [
        (
            "/v1/chat/completions",
            {"messages": [*USER, {"content": "x"}]},
            "messages",
            "`messages[1].role` is required",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "robot", "content": "x"}]},
            "messages",
            "`messages[0].role` must be one of system, user, assistant, developer, tool.",
        ),
        (
            "/v1/completions",
            {"prompt": "x", "stop_token_ids": [1, "a"]},
            "stop_token_ids",
            "`stop_token_ids[1]` must be an integer from 0 to 2147483647.",
        ),
        (
            "/v1/completions",
            {"prompt": "x", "n": 17},
            "n",
            "`n` must be an integer from 1 to 16.",
        ),
        (
            "/v1/responses",
            {"input": "x", "tools": [{"type": "function", "name": "f", "colour": "red"}]},
            "tools",
            "unknown field `tools[0].colour`",
        ),
        (
            "/v1/responses",
            {"input": "x", "reasoning": {"effort": "huge"}},
            "reasoning",
            "`reasoning.effort` must be one of none, minimal, low, medium, high, xhigh, max.",
        ),
        (
            "/detokenize",
            {"tokens": [5, -1]},
            "tokens",
            "`tokens[1]` must be an integer from 0 to 2147483647.",
        ),
    ],
)
def test_a_bad_member_is_reported_by_its_whole_path_under_its_top_level_field(
    client, path, body, param, message
):
    error = assert_error(client.simulate_post(path, json=body), 400, param)

    assert error["message"] == message


def test_a_member_of_stream_options_is_named_in_the_message_and_reported_as_stream_options(
    client,
):
    body = {"prompt": "x", "stream": True, "stream_options": {"include_usage": "yes"}}

    error = assert_error(client.simulate_post("/v1/completions", json=body), 400, "stream_options")

    assert error["message"] == "`stream_options.include_usage` must be a boolean."


@pytest.mark.parametrize("field", ["max_tokens", "n", "seed", "top_k", "min_tokens", "logprobs"])
def test_an_integral_float_is_taken_as_an_integer(client, field):
    body = {"prompt": "x", "max_tokens": 2, field: 1.0}

    assert client.simulate_post("/v1/completions", json=body).status_code == 200


def test_fields_chat_does_not_declare_are_ignored_as_vllm_ignores_them(client):
    body = {"messages": USER, "max_tokens": 2, "user": "u", "frequency": [1], "name": None}

    assert client.simulate_post("/v1/chat/completions", json=body).status_code == 200


def test_a_string_for_an_integer_is_refused_not_converted(client):
    error = assert_error(
        client.simulate_post("/v1/completions", json={"prompt": "x", "max_tokens": "2"}),
        400,
        "max_tokens",
    )

    assert error["message"] == "`max_tokens` must be an integer from 0 to 2147483647."


@pytest.mark.parametrize("where", ["response_format", "ignored"])
def test_a_body_nested_too_deeply_is_a_400_not_a_crash(client, where):
    depth = 100_000
    deep = "[" * depth + "]" * depth
    body = json.dumps({"messages": USER, where: {"a": "<deep>"}}).replace('"<deep>"', deep)

    result = client.simulate_post(
        "/v1/chat/completions", body=body, headers={"content-type": "application/json"}
    )

    assert "nested too deeply" in assert_error(result, 400)["message"]


@pytest.mark.parametrize(
    ("path", "odd"),
    [
        ("/v1/chat/completions", '"x": NaN'),
        ("/v1/completions", '"temperature": Infinity'),
        ("/v1/responses", '"instructions": "\\ud800"'),
    ],
)
def test_a_body_read_again_for_an_odd_literal_stays_a_400_when_a_member_is_nested_deep(
    client, path, odd
):
    # json.loads reads 600 levels; the second reading must not run out of stack on them.
    deep = "[" * 600 + "]" * 600
    fields = {
        "/v1/chat/completions": f'"messages": [{{"role": "user", "content": "hi"}}], '
        f'"response_format": {{"a": {deep}}}',
        "/v1/completions": f'"prompt": "hi", "structured_outputs": {{"json": {deep}}}',
        "/v1/responses": f'"input": [{{"role": "user", "content": "a", "x": {deep}}}]',
    }[path]
    body = "{" + fields + ", " + odd + "}"

    result = client.simulate_post(path, body=body, headers={"content-type": "application/json"})

    assert_error(result, 400)


def test_a_logit_bias_key_with_a_trailing_newline_is_not_a_token_id(client):
    body = {"prompt": "x", "max_tokens": 1, "logit_bias": {"5\n": 1}}

    assert_error(client.simulate_post("/v1/completions", json=body), 400, "logit_bias")


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": "x", "logprobs": -1, "logprob_token_ids": [-5]}, "logprobs"),
        (
            "/v1/chat/completions",
            {"messages": USER, "logprobs": True, "top_logprobs": 50, "logprob_token_ids": [-1]},
            "top_logprobs",
        ),
        ("/v1/responses", {"input": "x", "include": ["x"], "logprob_token_ids": [-1]}, "include"),
    ],
)
def test_logprob_errors_come_in_the_documented_order_whatever_the_token_ids(
    client, path, body, param
):
    assert_error(client.simulate_post(path, json=body), 400, param)


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "hi", "logprobs": 5, "temperature": "hot"},
        {"messages": USER, "max_tokens": 0},
    ],
)
def test_tokenize_ignores_the_generation_fields_it_does_not_use(client, body):
    result = client.simulate_post("/tokenize", json=body)

    assert result.status_code == 200, result.text
    assert result.json["count"] > 0


@pytest.mark.parametrize("name", ["a.b", "[x", ""])
def test_an_unknown_responses_field_is_named_whole_in_param_whatever_its_characters(client, name):
    result = client.simulate_post("/v1/responses", json={"input": "x", name: 1})

    assert_error(result, 400, name)
