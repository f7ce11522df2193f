"""Bad input gets an OpenAI error envelope with the right status, before admission."""

from __future__ import annotations

import pytest

from tests.integration.http.conftest import MAX_MODEL_LEN, MODEL_NAME

pytestmark = pytest.mark.model

ENVELOPE_KEYS = {"message", "type", "param", "code"}


def assert_error(result, status: int, param: str | None = None) -> dict:
    assert result.status_code == status, result.text
    error = result.json["error"]
    assert set(error) == ENVELOPE_KEYS and error["code"] == status and error["message"]
    if param is not None:
        assert error["param"] == param
    return error


def test_malformed_json_is_a_400(client):
    result = client.simulate_post(
        "/v1/completions", body=b'{"prompt": "x",', headers={"content-type": "application/json"}
    )

    assert_error(result, 400)


def test_a_body_that_is_not_an_object_is_a_400(client):
    assert_error(client.simulate_post("/v1/completions", json=[1, 2]), 400)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", "ten"),
        ("temperature", "hot"),
        ("n", 1.5),
        ("stream", "yes"),
        ("seed", True),
        ("stop", 3),
        ("logit_bias", [1]),
        ("stop_token_ids", ["a"]),
        ("top_k", 2.5),
    ],
)
def test_a_wrong_type_is_a_400_naming_the_field(client, field, value):
    result = client.simulate_post("/v1/completions", json={"prompt": "x", field: value})

    assert_error(result, 400, field)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", -1),
        ("temperature", -0.5),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("n", 0),
        ("n", 17),
        ("min_p", 2.0),
        ("presence_penalty", 3.0),
        ("repetition_penalty", 0.0),
        ("top_k", -2),
        ("min_tokens", 99),
        ("logit_bias", {"5": 200}),
    ],
)
def test_an_out_of_range_value_is_a_400_naming_the_field(client, field, value):
    result = client.simulate_post(
        "/v1/completions", json={"prompt": "x", "max_tokens": 4, field: value}
    )

    assert_error(result, 400, field)


def test_an_unknown_model_is_a_404(client):
    result = client.simulate_post("/v1/completions", json={"model": "gpt-9", "prompt": "x"})

    assert "gpt-9" in assert_error(result, 404, "model")["message"]


def test_a_prompt_over_max_model_len_is_a_400(client):
    result = client.simulate_post("/v1/completions", json={"prompt": [5] * MAX_MODEL_LEN})

    assert_error(result, 400, "prompt")


def test_prompt_plus_max_tokens_over_max_model_len_is_a_400(client):
    result = client.simulate_post(
        "/v1/completions", json={"prompt": [5] * 10, "max_tokens": MAX_MODEL_LEN}
    )

    assert_error(result, 400, "max_tokens")


@pytest.mark.parametrize("prompt", ["", [], [[]], [1, "a"], None, [-1], [10**9]])
def test_an_empty_or_malformed_prompt_is_a_400(client, prompt):
    assert_error(client.simulate_post("/v1/completions", json={"prompt": prompt}), 400, "prompt")


@pytest.mark.parametrize(
    "messages",
    [
        [],
        None,
        [{"content": "hi"}],
        [{"role": "robot", "content": "x"}],
        [{"role": "user", "content": [{"type": "image_url"}]}],
    ],
)
def test_malformed_chat_messages_are_a_400(client, messages):
    result = client.simulate_post("/v1/chat/completions", json={"messages": messages})

    assert_error(result, 400, "messages")


def test_stream_options_without_stream_is_a_400(client):
    result = client.simulate_post(
        "/v1/completions", json={"prompt": "x", "stream_options": {"include_usage": True}}
    )

    assert_error(result, 400, "stream_options")


def test_max_tokens_zero_without_echo_is_a_400(client):
    assert_error(
        client.simulate_post("/v1/completions", json={"prompt": "x", "max_tokens": 0}),
        400,
        "max_tokens",
    )


def test_an_oversized_body_is_a_413(client):
    result = client.simulate_post(
        "/v1/completions",
        body=b"{" + b" " * (9 << 20) + b"}",
        headers={"content-type": "application/json"},
    )

    assert_error(result, 413)


def test_unknown_routes_and_methods_get_the_envelope(client):
    assert_error(client.simulate_get("/v1/nothing"), 404)
    assert_error(client.simulate_delete("/v1/models"), 405)


def test_a_missing_or_wrong_api_key_is_a_401_and_health_needs_none(keyed_client):
    assert_error(keyed_client.simulate_get("/v1/models"), 401)
    wrong = keyed_client.simulate_get("/v1/models", headers={"Authorization": "Bearer nope"})
    assert_error(wrong, 401)

    right = keyed_client.simulate_get("/v1/models", headers={"Authorization": "Bearer sk-1"})

    assert right.status_code == 200
    assert keyed_client.simulate_get("/health").status_code == 200


def test_the_server_keeps_serving_after_every_kind_of_bad_request(client):
    for body in ({"prompt": ""}, {"prompt": "x", "n": 99}, {"prompt": [10**9]}):
        client.simulate_post("/v1/completions", json=body)

    ok = client.simulate_post("/v1/completions", json={"prompt": "x", "max_tokens": 2})

    assert ok.status_code == 200 and ok.json["usage"]["completion_tokens"] >= 1


def test_min_tokens_beyond_the_room_left_in_the_model_is_a_400(client):
    result = client.simulate_post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "x"}], "min_tokens": MAX_MODEL_LEN},
    )

    assert_error(result, 400, "min_tokens")


def _post_raw(client, path: str, body: str):
    # Built as text: Python cannot even print integers of more than 4300 digits.
    return client.simulate_post(path, body=body, headers={"content-type": "application/json"})


@pytest.mark.parametrize(
    ("path", "template", "param"),
    [
        ("/v1/completions", '{"prompt": "x", "max_tokens": %s}', "max_tokens"),
        ("/v1/completions", '{"prompt": "x", "seed": %s}', "seed"),
        ("/v1/completions", '{"prompt": "x", "n": %s}', "n"),
        ("/v1/completions", '{"prompt": "x", "top_k": %s}', "top_k"),
        ("/v1/completions", '{"prompt": "x", "min_tokens": %s}', "min_tokens"),
        ("/v1/completions", '{"prompt": "x", "logprobs": %s}', "logprobs"),
        ("/v1/completions", '{"prompt": "x", "prompt_logprobs": %s}', "prompt_logprobs"),
        ("/v1/completions", '{"prompt": [5, %s]}', "prompt"),
        ("/v1/completions", '{"prompt": "x", "stop_token_ids": [%s]}', "stop_token_ids"),
        ("/v1/completions", '{"prompt": "x", "logit_bias": {"%s": 1}}', "logit_bias"),
        ("/v1/completions", '{"prompt": "x", "temperature": %s}', "temperature"),
        (
            "/v1/completions",
            '{"prompt": "x", "logprobs": 1, "logprob_token_ids": [%s]}',
            "logprob_token_ids",
        ),
        (
            "/v1/chat/completions",
            '{"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": %s}',
            "max_completion_tokens",
        ),
        (
            "/v1/chat/completions",
            '{"messages": [{"role": "user", "content": "x"}], "logprobs": true, '
            '"top_logprobs": %s}',
            "top_logprobs",
        ),
        ("/detokenize", '{"tokens": [%s]}', "tokens"),
    ],
)
@pytest.mark.parametrize("digits", [5_000, 100_000])
def test_an_integer_of_thousands_of_digits_is_a_400_naming_the_field(
    client, path, template, param, digits
):
    result = _post_raw(client, path, template % ("9" * digits))

    assert_error(result, 400, param)


@pytest.mark.parametrize(
    ("field", "value"),
    [("top_k", 1e300), ("max_tokens", 2.5), ("n", 1e300), ("seed", 1e300), ("min_tokens", 0.5)],
)
def test_a_huge_or_fractional_float_in_an_integer_field_is_a_400(client, field, value):
    result = client.simulate_post("/v1/completions", json={"prompt": "x", field: value})

    assert_error(result, 400, field)


@pytest.mark.parametrize("seed", [2**63, -(2**63) - 1, 2**64 - 1])
def test_a_seed_outside_signed_64_bits_is_a_400(client, seed):
    result = client.simulate_post("/v1/completions", json={"prompt": "x", "seed": seed})

    assert (
        "-9223372036854775808 to 9223372036854775807"
        in assert_error(result, 400, "seed")["message"]
    )


@pytest.mark.parametrize("seed", [2**63 - 1, -(2**63)])
def test_a_seed_at_either_end_of_signed_64_bits_is_served(client, seed):
    body = {"prompt": "x", "seed": seed, "max_tokens": 2}

    assert client.simulate_post("/v1/completions", json=body).status_code == 200


@pytest.mark.parametrize("role", ["user", "system", "developer", "tool", "assistant"])
@pytest.mark.parametrize("content", [{}, {"content": None}], ids=["absent", "null"])
def test_a_message_without_content_is_a_400(client, role, content):
    messages = [{"role": "user", "content": "hi"}, {"role": role, **content}]

    result = client.simulate_post("/v1/chat/completions", json={"messages": messages})

    assert "needs `content`" in assert_error(result, 400, "messages")["message"]


TOOL_CALLS = [{"id": "call-1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]


@pytest.mark.parametrize("content", [{}, {"content": None}], ids=["absent", "null"])
def test_an_assistant_message_with_tool_calls_may_leave_content_out(client, content):
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "tool_calls": TOOL_CALLS, **content},
        {"role": "user", "content": "and then?"},
    ]

    result = client.simulate_post(
        "/v1/chat/completions", json={"messages": messages, "max_tokens": 2}
    )

    assert result.status_code == 200, result.text


def test_tool_calls_are_kept_out_of_the_chat_template(client):
    with_calls = [{"role": "assistant", "content": "ok", "tool_calls": TOOL_CALLS}]
    without = [{"role": "assistant", "content": "ok"}]

    tokens = [
        client.simulate_post("/tokenize", json={"messages": messages}).json["tokens"]
        for messages in (with_calls, without)
    ]

    assert tokens[0] == tokens[1]


@pytest.mark.parametrize("tool_calls", [[], "call", [1], {"id": "x"}])
def test_malformed_tool_calls_are_a_400(client, tool_calls):
    messages = [{"role": "assistant", "content": "ok", "tool_calls": tool_calls}]

    result = client.simulate_post("/v1/chat/completions", json={"messages": messages})

    assert_error(result, 400, "messages")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/tokenize", {"prompt": "hi"}),
        ("/tokenize", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/detokenize", {"tokens": [5]}),
    ],
)
def test_tokenize_and_detokenize_refuse_an_unknown_model_as_v1_routes_do(client, path, body):
    unknown = client.simulate_post(path, json={**body, "model": "gpt-9"})
    served = client.simulate_post(path, json={**body, "model": MODEL_NAME})

    error = assert_error(unknown, 404, "model")
    assert error == {
        "message": "The model `gpt-9` does not exist.",
        "type": "NotFoundError",
        "param": "model",
        "code": 404,
    }
    assert served.status_code == 200
