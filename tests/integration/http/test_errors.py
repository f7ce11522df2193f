"""Bad input gets an OpenAI error envelope with the right status, before admission."""

from __future__ import annotations

import pytest

from tests.integration.http.conftest import MAX_MODEL_LEN

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
