"""`POST /v1/chat/completions` through the Falcon app over a tiny real model."""

from __future__ import annotations

import pytest

from tests.integration.http.conftest import MODEL_NAME
from tests.support.asgi_stream import stream_post
from tests.support.sse import json_frames

pytestmark = pytest.mark.model

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
GREEDY = {"temperature": 0, "ignore_eos": True}


def post(client, body: dict):
    return client.simulate_post("/v1/chat/completions", json=body)


def test_chat_renders_the_models_template_and_answers_as_the_assistant(client, served):
    body = post(client, {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 5, **GREEDY}).json

    rendered = served.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["usage"]["prompt_tokens"] == len(
        served.tokenizer.encode(rendered, add_special_tokens=False)
    )
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and isinstance(
        choice["message"]["content"], str
    )
    assert choice["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 5


def test_add_generation_prompt_false_leaves_the_assistant_header_out(client, served):
    with_header = post(client, {"messages": MESSAGES, "max_tokens": 1, **GREEDY}).json
    without = post(
        client, {"messages": MESSAGES, "max_tokens": 1, "add_generation_prompt": False, **GREEDY}
    ).json

    assert without["usage"]["prompt_tokens"] < with_header["usage"]["prompt_tokens"]


def test_max_completion_tokens_wins_over_max_tokens(client):
    body = post(
        client, {"messages": MESSAGES, "max_tokens": 9, "max_completion_tokens": 3, **GREEDY}
    ).json

    assert body["usage"]["completion_tokens"] == 3


def test_text_parts_content_equals_the_same_string_content(client):
    parts = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo!"}],
        }
    ]
    plain = [{"role": "user", "content": "Hello!"}]

    a = post(client, {"messages": parts, "max_tokens": 4, **GREEDY}).json
    b = post(client, {"messages": plain, "max_tokens": 4, **GREEDY}).json

    assert a["choices"][0]["message"] == b["choices"][0]["message"]


def test_chat_stream_starts_with_the_role_and_concatenates_to_the_whole_answer(client, app):
    request = {"messages": MESSAGES, "max_tokens": 6, "n": 2, "seed": 9, "ignore_eos": True}
    whole = post(client, request).json

    _, text = stream_post(
        app,
        "/v1/chat/completions",
        json={**request, "stream": True, "stream_options": {"include_usage": True}},
    )

    chunks = json_frames(text)
    usage = chunks.pop()
    assert [c["choices"][0]["delta"] for c in chunks[:2]] == [
        {"role": "assistant", "content": ""}
    ] * 2
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    contents = {0: "", 1: ""}
    for chunk in chunks[2:]:
        (choice,) = chunk["choices"]
        contents[choice["index"]] += choice["delta"].get("content", "")
    assert [contents[0], contents[1]] == [c["message"]["content"] for c in whole["choices"]]
    assert usage["choices"] == [] and usage["usage"] == whole["usage"]


def test_with_continuous_usage_stats_every_chunk_carries_the_usage_the_role_chunks_included(app):
    request = {"messages": MESSAGES, "max_tokens": 3, "n": 2, **GREEDY, "stream": True}
    _, text = stream_post(
        app,
        "/v1/chat/completions",
        json={**request, "stream_options": {"continuous_usage_stats": True}},
    )

    chunks = json_frames(text)
    prompt_tokens = chunks[-1]["usage"]["prompt_tokens"]
    assert [c["choices"][0]["delta"].get("role") for c in chunks[:2]] == ["assistant"] * 2
    opening = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 0,
        "total_tokens": prompt_tokens,
    }
    assert [c["usage"] for c in chunks[:2]] == [opening] * 2
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 6
