"""`POST /v1/completions` through the Falcon app over a tiny real model."""

from __future__ import annotations

import pytest

from tests.integration.http.conftest import MODEL_NAME
from tests.support.asgi_stream import stream_post
from tests.support.sse import json_frames

pytestmark = pytest.mark.model

GREEDY = {"temperature": 0, "ignore_eos": True}


def post(client, body: dict):
    return client.simulate_post("/v1/completions", json=body)


def test_a_string_prompt_gets_a_text_completion_with_usage(client, served):
    result = post(client, {"model": MODEL_NAME, "prompt": "Hello there", "max_tokens": 5, **GREEDY})

    body = result.json
    assert result.status_code == 200
    assert body["object"] == "text_completion" and body["model"] == MODEL_NAME
    assert body["id"].startswith("cmpl-") and isinstance(body["created"], int)
    choice = body["choices"][0]
    assert (
        choice["index"] == 0 and choice["finish_reason"] == "length" and choice["logprobs"] is None
    )
    prompt_tokens = len(served.tokenizer.encode("Hello there"))
    assert body["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 5,
        "total_tokens": prompt_tokens + 5,
    }


def test_a_token_id_prompt_equals_the_same_prompt_as_text(client, served):
    ids = served.tokenizer.encode("Hello there")

    as_text = post(client, {"prompt": "Hello there", "max_tokens": 6, **GREEDY}).json
    as_ids = post(client, {"prompt": ids, "max_tokens": 6, **GREEDY}).json

    assert as_ids["choices"][0]["text"] == as_text["choices"][0]["text"]


def test_batched_prompts_number_choices_prompt_major_with_n(client):
    body = post(
        client,
        {"prompt": ["one", "two words"], "n": 2, "max_tokens": 3, "seed": 5, "ignore_eos": True},
    ).json

    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert body["usage"]["completion_tokens"] == 12


def test_n_seeded_choices_differ_from_each_other_but_repeat_across_requests(client):
    request = {
        "prompt": "seeded",
        "n": 3,
        "max_tokens": 8,
        "seed": 11,
        "temperature": 1.0,
        "ignore_eos": True,
    }

    first = [c["text"] for c in post(client, request).json["choices"]]
    again = [c["text"] for c in post(client, request).json["choices"]]

    assert first == again and len(set(first)) > 1


def test_echo_prepends_the_prompt_text(client):
    plain = post(client, {"prompt": "Hello", "max_tokens": 4, **GREEDY}).json
    echoed = post(client, {"prompt": "Hello", "max_tokens": 4, "echo": True, **GREEDY}).json

    assert echoed["choices"][0]["text"] == "Hello" + plain["choices"][0]["text"]


def test_echo_with_max_tokens_zero_returns_the_prompt_only(client, served):
    body = post(client, {"prompt": "Hello", "max_tokens": 0, "echo": True}).json

    assert body["choices"][0]["text"] == "Hello"
    assert body["usage"]["completion_tokens"] == 0


def test_a_stop_string_truncates_the_text_and_is_reported(client):
    full = post(client, {"prompt": "Hello", "max_tokens": 12, **GREEDY}).json["choices"][0]["text"]
    stop = full[3:5]

    body = post(client, {"prompt": "Hello", "max_tokens": 12, "stop": [stop], **GREEDY}).json

    choice = body["choices"][0]
    assert choice["text"] == full[: full.index(stop)]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop


def test_streamed_text_concatenates_to_the_non_streamed_text(client, app):
    request = {"prompt": ["alpha", "beta"], "max_tokens": 7, "n": 2, "seed": 3, "ignore_eos": True}
    whole = post(client, request).json

    status, text = stream_post(
        app,
        "/v1/completions",
        json={**request, "stream": True, "stream_options": {"include_usage": True}},
    )

    assert status == 200
    chunks = json_frames(text)
    usage = chunks.pop()
    texts = {index: "" for index in range(4)}
    finishes = {}
    for chunk in chunks:
        (choice,) = chunk["choices"]
        texts[choice["index"]] += choice["text"]
        if choice["finish_reason"] is not None:
            finishes[choice["index"]] = choice["finish_reason"]
    assert [texts[i] for i in range(4)] == [c["text"] for c in whole["choices"]]
    assert finishes == {i: "length" for i in range(4)}
    assert usage["choices"] == [] and usage["usage"] == whole["usage"]


def test_stream_with_continuous_usage_stats_counts_up(app):
    _, text = stream_post(
        app,
        "/v1/completions",
        json={
            "prompt": "Hi",
            "max_tokens": 4,
            "stream": True,
            **GREEDY,
            "stream_options": {"continuous_usage_stats": True},
        },
    )

    counts = [c["usage"]["completion_tokens"] for c in json_frames(text)]
    assert counts == sorted(counts) and counts[-1] == 4


def test_seeded_sampling_is_the_same_alone_and_among_concurrent_requests(client):
    request = {
        "prompt": "The",
        "max_tokens": 10,
        "seed": 42,
        "temperature": 0.9,
        "top_p": 0.9,
        "ignore_eos": True,
    }
    alone = post(client, request).json["choices"][0]["text"]

    batch = post(client, {**request, "prompt": ["The", "Other", "Third one"]}).json

    assert batch["choices"][0]["text"] == alone
