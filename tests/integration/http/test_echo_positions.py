"""Echoed logprob arrays are indexed by position: prompt entries, then one per completion token.

Scorers such as lm-eval read `token_logprobs[ctxlen:-1]`, assuming the arrays hold exactly the
prompt's tokens and then every generated token. Each response shape such a client indexes is
pinned here on a tiny model that ends deliberately, so a terminating EOS shows up right after
the prompt and after a short generation.
"""

from __future__ import annotations

import random

import pytest
from falcon import testing

from adapters.http.app import create_app
from adapters.http.serving import ModelHolder
from tests.integration.http.conftest import serve_tiny
from tests.support import http_json
from tests.support.asgi_stream import stream_post
from tests.support.sse import json_frames
from tests.support.tiny_serving import build_ending_model_dir

pytestmark = pytest.mark.model

ARRAYS = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
PROBES = 400


@pytest.fixture(scope="module")
def ending_served(tmp_path_factory):
    served = serve_tiny(
        build_ending_model_dir(tmp_path_factory.mktemp("echo-ending")), prompt_logprobs=True
    )
    yield served
    served.stop()


@pytest.fixture(scope="module")
def scoring(ending_served) -> testing.TestClient:
    return testing.TestClient(create_app(ModelHolder(served=ending_served)))


@pytest.fixture(scope="module")
def eos_name(ending_served) -> str:
    tokenizer = ending_served.tokenizer
    return f"token_id:{min(tokenizer.eos_token_ids)}"


def post(client, status: int = 200, **body) -> dict:
    return http_json.post(client, "/v1/completions", body, status=status)


def greedy_tokens(client, prompt: list[int], max_tokens: int) -> list[str]:
    body = post(
        client,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        logprobs=0,
        echo=True,
        return_tokens_as_token_ids=True,
    )
    return body["choices"][0]["logprobs"]["tokens"][len(prompt) :]


@pytest.fixture(scope="module")
def prompts(scoring, ending_served, eos_name) -> dict[str, list[int]]:
    """Token prompts found by probing the server: greedy EOS at once, EOS after 2 to 4 tokens,
    and no EOS within 6 tokens."""
    vocab = ending_served.tokenizer.vocab_size
    generator = random.Random(7)
    found: dict[str, list[int]] = {}
    for _ in range(PROBES):
        prompt = [generator.randrange(4, vocab) for _ in range(generator.randint(3, 12))]
        generated = greedy_tokens(scoring, prompt, 6)
        found.setdefault(_kind(generated, eos_name), prompt)
        found.pop(None, None)
        if len(found) == 3:
            return found
    raise AssertionError(f"probing found only {sorted(found)}")


def _kind(generated: list[str], eos_name: str) -> str | None:
    if eos_name not in generated:
        return "open"
    ends_at = generated.index(eos_name)
    if ends_at == 0:
        return "eos_next"
    return "eos_soon" if ends_at < 5 else None


def prompt_length(client, prompt: str) -> int:
    result = client.simulate_post("/tokenize", json={"prompt": prompt})
    return result.json["count"]


def assert_positional(choice: dict, prompt_len: int, completion_tokens: int) -> None:
    """Parallel arrays of prompt + completion length; position 0 null; offsets inside text."""
    logprobs = choice["logprobs"]
    assert [len(logprobs[key]) for key in ARRAYS] == [prompt_len + completion_tokens] * 4
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert all(value is not None for value in logprobs["token_logprobs"][1:])
    offsets = logprobs["text_offset"]
    assert offsets == sorted(offsets) and all(0 <= o <= len(choice["text"]) for o in offsets)
    for token, value, top in zip(
        logprobs["tokens"][1:],
        logprobs["token_logprobs"][1:],
        logprobs["top_logprobs"][1:],
        strict=True,
    ):
        assert top[token] == value


def test_echo_with_max_tokens_zero_has_exactly_the_prompt_entries(scoring, prompts):
    prompt = prompts["eos_next"]

    body = post(scoring, prompt=prompt, echo=True, logprobs=1, max_tokens=0)

    assert_positional(body["choices"][0], len(prompt), 0)
    assert body["usage"]["completion_tokens"] == 0


def test_echo_with_max_tokens_one_gives_a_terminating_eos_its_entry(scoring, prompts, eos_name):
    prompt = prompts["eos_next"]

    body = post(
        scoring,
        prompt=prompt,
        echo=True,
        logprobs=1,
        max_tokens=1,
        temperature=0,
        return_tokens_as_token_ids=True,
    )

    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] is None
    assert body["usage"]["completion_tokens"] == 1
    assert_positional(choice, len(prompt), 1)
    assert choice["logprobs"]["tokens"][-1] == eos_name
    assert choice["logprobs"]["text_offset"][-1] == len(choice["text"])


def test_echo_with_max_tokens_one_and_an_ordinary_token_ends_with_length(scoring, prompts):
    prompt = prompts["open"]

    body = post(scoring, prompt=prompt, echo=True, logprobs=1, max_tokens=1, temperature=0)

    assert body["choices"][0]["finish_reason"] == "length"
    assert_positional(body["choices"][0], len(prompt), 1)


def test_echo_keeps_the_entry_of_an_eos_after_several_tokens(scoring, prompts, eos_name):
    prompt = prompts["eos_soon"]

    body = post(
        scoring,
        prompt=prompt,
        echo=True,
        logprobs=2,
        max_tokens=8,
        temperature=0,
        return_tokens_as_token_ids=True,
    )

    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert_positional(choice, len(prompt), body["usage"]["completion_tokens"])
    assert choice["logprobs"]["tokens"][-1] == eos_name


def test_without_echo_a_terminating_eos_still_has_no_entry(scoring, prompts):
    prompt = prompts["eos_soon"]

    body = post(scoring, prompt=prompt, logprobs=1, max_tokens=8, temperature=0)

    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert len(choice["logprobs"]["tokens"]) == body["usage"]["completion_tokens"] - 1


def test_echo_gives_a_terminating_stop_token_id_its_entry(scoring, prompts):
    prompt = prompts["open"]
    generated = greedy_tokens(scoring, prompt, 3)
    stop_id = int(generated[1].removeprefix("token_id:"))
    # The stop must end the choice at the second token, not earlier.
    assert generated[0] != generated[1]

    body = post(
        scoring,
        prompt=prompt,
        echo=True,
        logprobs=0,
        max_tokens=6,
        temperature=0,
        stop_token_ids=[stop_id],
        return_tokens_as_token_ids=True,
    )

    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop_id
    assert body["usage"]["completion_tokens"] == 2
    assert_positional(choice, len(prompt), 2)
    assert choice["logprobs"]["tokens"][-1] == f"token_id:{stop_id}"


def test_echo_keeps_an_entry_for_every_completion_token_at_a_stop_string(scoring):
    prompt = "The quick brown fox jumps over the lazy dog"
    probe = post(scoring, prompt=prompt, max_tokens=8, temperature=0, ignore_eos=True)
    generated = probe["choices"][0]["text"]
    # A stop string made of generated text past the first character cuts the choice short.
    stop = generated[2:4] if len(generated) >= 4 else generated[-1]

    body = post(
        scoring,
        prompt=prompt,
        echo=True,
        logprobs=1,
        max_tokens=8,
        temperature=0,
        ignore_eos=True,
        stop=[stop],
    )

    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop
    prompt_len = body["usage"]["prompt_tokens"]
    assert_positional(choice, prompt_len, body["usage"]["completion_tokens"])


@pytest.mark.parametrize("kind", ["token-ids", "strings"])
def test_batched_prompts_with_n_choices_each_index_their_own_prompt(scoring, prompts, kind):
    if kind == "token-ids":
        batch = [prompts["eos_next"], prompts["eos_soon"], prompts["open"]]
        prompt_lens = [len(prompt) for prompt in batch]
    else:
        batch = ["Hello there", "The quick brown fox"]
        prompt_lens = [prompt_length(scoring, prompt) for prompt in batch]

    body = post(
        scoring, prompt=batch, n=2, echo=True, logprobs=1, max_tokens=5, seed=3, temperature=1.0
    )

    choices = body["choices"]
    assert [c["index"] for c in choices] == list(range(2 * len(batch)))
    generated = 0
    for choice in choices:
        prompt_len = prompt_lens[choice["index"] // 2]
        completion = len(choice["logprobs"]["tokens"]) - prompt_len
        assert 1 <= completion <= 5
        assert_positional(choice, prompt_len, completion)
        generated += completion
    assert generated == body["usage"]["completion_tokens"]


def test_streamed_echo_arrays_concatenate_to_the_non_streamed_positions(scoring, prompts):
    request = {
        "prompt": [prompts["eos_next"], prompts["eos_soon"]],
        "echo": True,
        "logprobs": 2,
        "max_tokens": 6,
        "temperature": 0,
        "n": 2,
    }
    whole = post(scoring, **request)

    status, text = stream_post(scoring.app, "/v1/completions", json={**request, "stream": True})

    assert status == 200
    joined: dict[int, dict] = {}
    for frame in json_frames(text):
        for choice in frame["choices"]:
            part = choice["logprobs"]
            if part is None:
                continue
            into = joined.setdefault(choice["index"], {key: [] for key in part})
            for key, values in part.items():
                into[key] += values
    for choice in whole["choices"]:
        assert choice["finish_reason"] == "stop"
        assert joined[choice["index"]] == choice["logprobs"]
        prompt_len = len(request["prompt"][choice["index"] // 2])
        assert len(choice["logprobs"]["tokens"]) > prompt_len
