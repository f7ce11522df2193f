"""Prefix caching on the wire: `cache_salt`'s 400s, cached prompt tokens in usage (only when
some were read), and salts that keep requests apart. The module serves the tiny model with the
cache on, as `helios serve` does by default; each test salts its requests, so the cache holds
nothing from other tests for them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from falcon import testing

from adapters.http.app import create_app
from adapters.http.serving import ModelHolder
from tests.integration.http.conftest import serve_tiny
from tests.integration.http.test_errors import assert_error
from tests.support.asgi_stream import stream_post
from tests.support.sse import json_frames

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def app(http_model_dir: Path) -> Iterator[object]:
    served = serve_tiny(http_model_dir, prefix_caching="sha256", max_model_len=256)
    yield create_app(ModelHolder(served=served))
    served.stop()


@pytest.fixture(scope="module")
def client(app) -> testing.TestClient:
    return testing.TestClient(app)


LONG = "the quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat"
CHAT = [{"role": "user", "content": LONG}]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "x", "max_tokens": 2}),
        ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 2}),
        ("/v1/responses", {"input": "x", "max_output_tokens": 2}),
    ],
)
@pytest.mark.parametrize("salt", ["", 7, ["a"], "x" * 257, "é" * 129])
def test_a_salt_that_is_not_a_short_non_empty_string_is_a_400_naming_it(client, path, body, salt):
    result = client.simulate_post(path, json={**body, "cache_salt": salt})

    assert_error(result, 400, "cache_salt")


def completion(client, salt: str, prompt: str = LONG) -> dict:
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 0, "cache_salt": salt}
    result = client.simulate_post("/v1/completions", json=body)
    assert result.status_code == 200, result.text
    return result.json


def test_a_repeated_prompt_reports_its_cached_tokens_and_says_the_same(client):
    first, second = completion(client, "repeat"), completion(client, "repeat")

    assert "prompt_tokens_details" not in first["usage"]
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached < second["usage"]["prompt_tokens"] and cached % 8 == 0
    assert second["choices"][0]["text"] == first["choices"][0]["text"]


def test_another_salt_reads_nothing_of_a_salted_prompt(client):
    completion(client, "alice")

    assert "prompt_tokens_details" not in completion(client, "bob")["usage"]
    assert "prompt_tokens_details" in completion(client, "alice")["usage"]


def test_a_stream_reports_cached_tokens_in_its_usage_chunk(client, app):
    body = {
        "messages": CHAT,
        "max_tokens": 4,
        "temperature": 0,
        "cache_salt": "stream",
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    usages = []
    for _ in range(2):
        _, text = stream_post(app, "/v1/chat/completions", json=body)
        usages.append(json_frames(text)[-1]["usage"])

    assert "prompt_tokens_details" not in usages[0]
    assert usages[1]["prompt_tokens_details"]["cached_tokens"] > 0


def test_responses_report_cached_input_tokens(client):
    body = {"input": LONG, "max_output_tokens": 4, "temperature": 0, "cache_salt": "responses"}
    details = []
    for _ in range(2):
        result = client.simulate_post("/v1/responses", json=body)
        assert result.status_code == 200, result.text
        details.append(result.json["usage"]["input_tokens_details"]["cached_tokens"])

    assert details[0] == 0 < details[1]


def test_a_follow_up_reads_the_earlier_turn_from_the_cache(client):
    body = {"input": LONG, "max_output_tokens": 4, "temperature": 0, "cache_salt": "turns"}
    first = client.simulate_post("/v1/responses", json=body).json
    follow_up = {**body, "input": "and then?", "previous_response_id": first["id"]}

    result = client.simulate_post("/v1/responses", json=follow_up)

    assert result.status_code == 200, result.text
    usage = result.json["usage"]
    assert usage["input_tokens_details"]["cached_tokens"] >= first["usage"]["input_tokens"] // 2
