"""Prompt logprobs on the wire: echo with logprobs, vLLM's `prompt_logprobs`, and their errors."""

from __future__ import annotations

import random

import pytest
import torch
from falcon import testing

from adapters.http.app import create_app
from adapters.http.serving import ModelHolder
from tests.integration.http.conftest import serve_tiny
from tests.support import http_json
from tests.support.asgi_stream import stream_post
from tests.support.sse import json_frames

pytestmark = pytest.mark.model

CHUNK = 48  # scored capacities (48,): long prompts are scored over several chunks


@pytest.fixture(scope="module")
def scoring_served(http_model_dir):
    served = serve_tiny(http_model_dir, prompt_logprobs=True, max_num_batched_tokens=CHUNK)
    yield served
    served.stop()


@pytest.fixture(scope="module")
def scoring(scoring_served) -> testing.TestClient:
    return testing.TestClient(create_app(ModelHolder(served=scoring_served)))


def token_prompt(length: int, seed: int, vocab: int) -> list[int]:
    generator = random.Random(seed)
    return [generator.randrange(vocab) for _ in range(length)]


def post(client, path: str, status: int = 200, **body):
    return http_json.post(client, path, body, status=status)


def tokenize(client, text: str) -> list[int]:
    return post(client, "/tokenize", prompt=text)["tokens"]


def test_echo_with_logprobs_scores_every_prompt_token_then_the_generated_ones(
    scoring, scoring_served, reference
):
    vocab = scoring_served.tokenizer.vocab_size
    prompt = token_prompt(100, 1, vocab)
    body = post(
        scoring,
        "/v1/completions",
        prompt=prompt,
        echo=True,
        logprobs=2,
        max_tokens=1,
        temperature=0,
        ignore_eos=True,
        return_tokens_as_token_ids=True,
    )
    logprobs = body["choices"][0]["logprobs"]
    tokens = [int(t.removeprefix("token_id:")) for t in logprobs["tokens"]]
    assert tokens[:-1] == prompt and len(tokens) == 101
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    expected = reference(tokens)
    for position in range(1, 101):
        row = expected[position - 1, :vocab]
        value = logprobs["token_logprobs"][position]
        assert value == pytest.approx(row[tokens[position]].item(), abs=1e-4)
        top = logprobs["top_logprobs"][position]
        assert next(iter(top)) == logprobs["tokens"][position]
        assert top[logprobs["tokens"][position]] == value
        best = torch.argsort(row, descending=True, stable=True)[:2].tolist()
        names = {f"token_id:{t}" for t in best}
        assert names <= set(top) and len(top) in (2, 3)
    # The generated token is the greedy one after the whole prompt.
    assert tokens[-1] == int(torch.argmax(expected[99, :vocab]))
    assert body["usage"] == {"prompt_tokens": 100, "completion_tokens": 1, "total_tokens": 101}


def test_echo_with_max_tokens_zero_returns_the_prompt_entries_only(scoring, scoring_served):
    prompt = token_prompt(30, 2, scoring_served.tokenizer.vocab_size)
    body = post(scoring, "/v1/completions", prompt=prompt, echo=True, logprobs=0, max_tokens=0)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length"
    assert len(choice["logprobs"]["tokens"]) == 30
    assert choice["logprobs"]["token_logprobs"][0] is None
    assert all(len(top) == 1 for top in choice["logprobs"]["top_logprobs"][1:])
    assert choice["text"] == scoring_served.tokenizer.decode(prompt, skip_special_tokens=False)
    assert body["usage"] == {"prompt_tokens": 30, "completion_tokens": 0, "total_tokens": 30}


def test_string_prompts_in_a_batch_each_echo_their_own_entries_with_offsets_into_text(scoring):
    prompts = ["Hello there, general", "The quick brown fox"]
    body = post(
        scoring,
        "/v1/completions",
        prompt=prompts,
        n=2,
        echo=True,
        logprobs=1,
        max_tokens=3,
        seed=5,
        ignore_eos=True,
    )
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    for choice in body["choices"]:
        prompt = prompts[choice["index"] // 2]
        prompt_tokens = tokenize(scoring, prompt)
        logprobs = choice["logprobs"]
        assert len(logprobs["tokens"]) == len(prompt_tokens) + 3
        assert choice["text"].startswith(prompt)
        assert "".join(logprobs["tokens"][: len(prompt_tokens)]) == prompt
        for offset, token in zip(logprobs["text_offset"], logprobs["tokens"], strict=True):
            assert choice["text"][offset:].startswith(token)
    first, second = body["choices"][0]["logprobs"], body["choices"][1]["logprobs"]
    count = len(tokenize(scoring, prompts[0]))
    assert first["token_logprobs"][:count] == second["token_logprobs"][:count]


def test_prompt_logprobs_extra_has_vllm_shape_with_exact_ranks(scoring, scoring_served, reference):
    vocab = scoring_served.tokenizer.vocab_size
    prompt = token_prompt(70, 3, vocab)
    body = post(
        scoring, "/v1/completions", prompt=prompt, prompt_logprobs=3, max_tokens=2, ignore_eos=True
    )
    choice = body["choices"][0]
    assert choice["logprobs"] is None
    listed = choice["prompt_logprobs"]
    assert len(listed) == 70 and listed[0] is None
    expected = reference(prompt)
    for position in range(1, 70):
        row = expected[position - 1, :vocab]
        entry = listed[position]
        keys = list(entry)
        assert keys[0] == str(prompt[position])
        actual = entry[keys[0]]
        assert actual["rank"] == 1 + int((row > row[prompt[position]]).sum())
        assert actual["logprob"] == pytest.approx(row[prompt[position]].item(), abs=1e-4)
        best = torch.argsort(row, descending=True, stable=True)[:3].tolist()
        assert {str(t) for t in best} <= set(keys) and len(keys) in (3, 4)
        for rank, token_id in enumerate(best, start=1):
            assert entry[str(token_id)]["rank"] == rank
            assert entry[str(token_id)]["decoded_token"] == scoring_served.tokenizer.token_bytes(
                token_id
            ).decode("utf-8", errors="replace")


def test_chat_prompt_logprobs_cover_the_templated_prompt(scoring):
    body = post(
        scoring,
        "/v1/chat/completions",
        messages=[{"role": "user", "content": "Hello!"}],
        prompt_logprobs=0,
        max_tokens=2,
    )
    listed = body["prompt_logprobs"]
    assert listed[0] is None
    assert len(listed) == body["usage"]["prompt_tokens"]
    assert all(len(entry) == 1 for entry in listed[1:])


def test_streamed_echo_logprobs_concatenate_to_the_non_streamed_result(scoring):
    request = {
        "prompt": "The quick brown fox jumps over the lazy dog, and the dog sleeps on",
        "echo": True,
        "logprobs": 2,
        "max_tokens": 5,
        "seed": 9,
        "n": 2,
        "ignore_eos": True,
    }
    whole = post(scoring, "/v1/completions", **request)
    status, text = stream_post(scoring.app, "/v1/completions", json={**request, "stream": True})
    assert status == 200
    joined: dict[int, dict] = {}
    texts: dict[int, str] = {}
    for frame in json_frames(text):
        for choice in frame["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
            part = choice["logprobs"]
            if part is None:
                continue
            into = joined.setdefault(choice["index"], {key: [] for key in part})
            for key, values in part.items():
                into[key] += values
    for choice in whole["choices"]:
        assert texts[choice["index"]] == choice["text"]
        assert joined[choice["index"]] == choice["logprobs"]


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs", "not available when"),
        ({"prompt_logprobs": 21}, "prompt_logprobs", "greater than max allowed: 20"),
        ({"prompt_logprobs": -1}, "prompt_logprobs", "positive value or 0"),
        ({"prompt_logprobs": "2"}, "prompt_logprobs", "integer"),
        (
            {"echo": True, "logprobs": 1, "logprob_token_ids": [1, 2]},
            "logprob_token_ids",
            "echo",
        ),
    ],
)
def test_bad_prompt_logprob_requests_are_rejected_before_admission(scoring, body, param, message):
    error = post(scoring, "/v1/completions", 400, prompt="Hello", **body)["error"]
    assert error["param"] == param and message in error["message"]
    assert error["type"] == "BadRequestError" and error["code"] == 400


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "Hello", "echo": True, "logprobs": 1}),
        ("/v1/completions", {"prompt": "Hello", "prompt_logprobs": 1}),
        ("/v1/completions", {"prompt": "Hello", "echo": True, "logprobs": 0, "max_tokens": 0}),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Hi"}], "prompt_logprobs": 0},
        ),
    ],
)
def test_a_server_without_prompt_scoring_answers_prompt_logprob_requests_with_400(
    client, path, body
):
    error = post(client, path, 400, **body)["error"]
    assert error["param"] == "prompt_logprobs"
    assert "--prompt-logprobs" in error["message"]


def test_ordinary_requests_still_show_null_prompt_logprobs(scoring):
    body = post(scoring, "/v1/completions", prompt="Hello", max_tokens=2)
    assert body["choices"][0]["prompt_logprobs"] is None
    chat = post(
        scoring, "/v1/chat/completions", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
    )
    assert chat["prompt_logprobs"] is None
