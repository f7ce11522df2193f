"""Generation logprobs end to end: real gunicorn, the embedded SmolLM2, the official client."""

from __future__ import annotations

import math
from collections.abc import Iterator

import openai
import pytest

from tests.e2e.conftest import RunningServer, running_server
from tests.support.completion_checks import check_completion_logprobs

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.model]

QUESTION = [{"role": "user", "content": "Name three fruits and say why they are good."}]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    workdir = tmp_path_factory.mktemp("smollm2-e2e")
    with running_server(None, workdir, "--kv-cache-memory", str(64 << 20)) as server:
        yield server


@pytest.fixture(scope="module")
def client(smollm2: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{smollm2.base_url}/v1", api_key="unused", max_retries=0)


def test_completion_logprobs_are_complete_consistent_and_index_into_the_text(client):
    reply = client.completions.create(
        model="SmolLM2-135M-Instruct",
        prompt="The best fruit is",
        max_tokens=24,
        temperature=0.7,
        seed=1,
        logprobs=5,
        extra_body={"ignore_eos": True},
    )

    assert reply.usage.completion_tokens == 24
    check_completion_logprobs(reply.choices[0], 24, top_k=5)


def test_chat_logprob_bytes_concatenate_to_the_generated_bytes(client):
    reply = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=QUESTION,
        max_tokens=30,
        temperature=0,
        logprobs=True,
        top_logprobs=4,
        extra_body={"ignore_eos": True},
    )

    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    raw = b"".join(bytes(entry.bytes) for entry in content)
    assert raw.decode("utf-8") == reply.choices[0].message.content
    for entry in content:
        assert len(entry.top_logprobs) == 4 and entry.top_logprobs[0].logprob >= entry.logprob
        values = [t.logprob for t in entry.top_logprobs]
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)


def test_streamed_chat_logprobs_equal_the_non_streamed_ones(client):
    request = dict(
        model="SmolLM2-135M-Instruct",
        messages=QUESTION,
        max_tokens=20,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    whole = client.chat.completions.create(**request).choices[0].logprobs.content

    streamed = []
    for chunk in client.chat.completions.create(**request, stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed += chunk.choices[0].logprobs.content

    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in whole]


def test_streamed_completion_logprobs_equal_the_non_streamed_ones(client):
    request = dict(
        model="SmolLM2-135M-Instruct",
        prompt="Once upon a time",
        max_tokens=16,
        temperature=0.8,
        seed=4,
        logprobs=3,
        n=2,
    )
    whole = client.completions.create(**request)

    merged = {0: [], 1: []}
    for chunk in client.completions.create(**request, stream=True):
        for choice in chunk.choices:
            if choice.logprobs is not None:
                merged[choice.index] += list(
                    zip(choice.logprobs.tokens, choice.logprobs.token_logprobs, strict=True)
                )

    for choice in whole.choices:
        assert merged[choice.index] == list(
            zip(choice.logprobs.tokens, choice.logprobs.token_logprobs, strict=True)
        )


def test_label_token_scores_come_back_in_caller_order(client):
    reply = client.completions.create(
        model="SmolLM2-135M-Instruct",
        prompt="Is Paris in France? Answer:",
        max_tokens=1,
        temperature=0,
        logprobs=0,
        extra_body={"logprob_token_ids": [2838, 9230], "return_tokens_as_token_ids": True},
    )

    top = reply.choices[0].logprobs.top_logprobs[0]
    assert list(top)[-2:] == ["token_id:2838", "token_id:9230"]
    assert math.log(sum(math.exp(v) for v in list(top.values())[-2:])) <= 0
