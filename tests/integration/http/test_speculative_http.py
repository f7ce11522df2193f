"""Speculation over HTTP: every logprob payload equals the one served without speculation.

Two servers over the same tiny model that ends deliberately (EOS is often its greedy choice),
one with `--speculative-config` (n-gram, k = 4), one without. Greedy requests must give the same
tokens, text and entries, values within 1e-5 (different batch shapes round the GEMM
differently on the CPU; bit equality is not promised), for each response shape the issue
names. The speculating server's records are watched, so each case also proves that drafts
were offered and accepted while it ran.
"""

from __future__ import annotations

import random

import pytest
from falcon import testing

from adapters.http.app import create_app
from adapters.http.serving import ModelHolder
from domain.contract.records import Role
from tests.integration.http.conftest import serve_tiny
from tests.support import http_json
from tests.support.asgi_stream import stream_post
from tests.support.payloads import assert_payloads_agree
from tests.support.sse import json_frames
from tests.support.tiny_serving import build_ending_model_dir

pytestmark = pytest.mark.model

NGRAM = (
    '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,'
    ' "prompt_lookup_max": 3}'
)
TOLERANCE = 1e-5
GREEDY = {"temperature": 0, "ignore_eos": True}


class RecordWatch:
    """Keeps the records of every frame the speculating executor returns."""

    def __init__(self, served) -> None:
        executor = served.engine._executor  # noqa: SLF001 - the test watches the real executor
        read = executor.read
        self.records: list = []

        def watched(frame):
            result = read(frame)
            self.records.extend(result.records)
            return result

        executor.read = watched

    def accepted_since(self, start: int) -> int:
        return sum(r.drafts_accepted for r in self.records[start:] if r.role is Role.SPECULATIVE)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_ending_model_dir(tmp_path_factory.mktemp("speculative-http"))


@pytest.fixture(scope="module")
def servers(model_dir):
    plain = serve_tiny(model_dir, prompt_logprobs=True)
    speculative = serve_tiny(model_dir, prompt_logprobs=True, speculative_config=NGRAM)
    watch = RecordWatch(speculative)
    yield (
        testing.TestClient(create_app(ModelHolder(served=plain))),
        testing.TestClient(create_app(ModelHolder(served=speculative))),
        watch,
    )
    plain.stop()
    speculative.stop()


def prompt(seed: int, vocab: int = 300) -> list[int]:
    generator = random.Random(seed)
    phrase = [generator.randrange(4, vocab) for _ in range(generator.randint(3, 6))]
    return phrase * 3 + phrase[:2]


def post(client, path: str = "/v1/completions", **body) -> dict:
    return http_json.post(client, path, body)


def compare(servers, path: str = "/v1/completions", **body) -> tuple[dict, int]:
    plain_client, speculative_client, watch = servers
    start = len(watch.records)
    plain = post(plain_client, path, **body)
    speculative = post(speculative_client, path, **body)
    assert_payloads_agree(plain, speculative, TOLERANCE, skipped=frozenset({"id", "created"}))
    return speculative, watch.accepted_since(start)


def batch(seeds: range) -> list[list[int]]:
    return [prompt(seed) for seed in seeds]


@pytest.mark.parametrize(
    "asked",
    [
        pytest.param({"logprobs": 20}, id="top-20"),
        pytest.param({"logprobs": 0, "logprob_token_ids": [5, 17, 99, 250]}, id="selected-ids"),
        pytest.param({"logprobs": 3, "n": 2}, id="n-2"),
        pytest.param({"prompt_logprobs": 5, "logprobs": 1}, id="prompt-logprobs"),
        pytest.param({"echo": True, "logprobs": 2}, id="echo"),
    ],
)
def test_completion_payloads_equal_speculation_off(servers, asked):
    body, accepted = compare(servers, prompt=batch(range(6)), max_tokens=24, **GREEDY, **asked)

    assert accepted > 0, "no draft stood: the comparison proves nothing"
    assert body["choices"][0]["logprobs"] is not None or "prompt_logprobs" in asked


def test_chat_payloads_equal_speculation_off(servers):
    messages = [{"role": "user", "content": "one two three one two three one two three one two"}]

    body, accepted = compare(
        servers,
        "/v1/chat/completions",
        messages=messages,
        max_tokens=30,
        logprobs=True,
        top_logprobs=5,
        **GREEDY,
    )

    assert body["choices"][0]["logprobs"]["content"]


def test_a_stop_string_cut_inside_an_accepted_run_equals_speculation_off(servers):
    plain_client, speculative_client, watch = servers
    texts = [
        post(plain_client, prompt=p, max_tokens=24, **GREEDY)["choices"][0]["text"]
        for p in batch(range(6))
    ]
    # Stop strings taken from the middle of the text each prompt would generate.
    stops = [text[len(text) // 2 : len(text) // 2 + 2] for text in texts if len(text) > 6]

    body, accepted = compare(
        servers, prompt=batch(range(6)), max_tokens=24, logprobs=2, stop=stops[:4], **GREEDY
    )

    assert accepted > 0
    assert any(choice["finish_reason"] == "stop" for choice in body["choices"])


@pytest.mark.parametrize("max_tokens", [3, 6, 11])
def test_max_tokens_reached_inside_a_run_equals_speculation_off(servers, max_tokens):
    body, accepted = compare(
        servers, prompt=batch(range(6)), max_tokens=max_tokens, logprobs=1, **GREEDY
    )

    assert all(len(c["logprobs"]["tokens"]) == max_tokens for c in body["choices"])
    assert max_tokens == 3 or accepted > 0


def eos_prompt(seed: int, eos_token_id: int) -> list[int]:
    """A repeated phrase with EOS inside, so history drafts can carry EOS."""
    generator = random.Random(seed)
    phrase = [generator.randrange(4, 300) for _ in range(generator.randint(3, 6))]
    phrase.insert(generator.randrange(1, len(phrase)), eos_token_id)
    return phrase * 3 + phrase[:2]


def test_eos_inside_a_speculative_round_equals_speculation_off(servers, model_dir):
    from adapters.tokenizer.hf import HfTokenizer

    plain_client, speculative_client, watch = servers
    eos = min(HfTokenizer.from_dir(model_dir).eos_token_ids)
    prompts = [eos_prompt(seed, eos) for seed in range(60)]
    start = len(watch.records)

    body, accepted = compare(
        servers, prompt=prompts, max_tokens=30, logprobs=1, temperature=0, echo=True
    )

    ending = [
        r
        for r in watch.records[start:]
        if r.role is Role.SPECULATIVE and r.drafts_accepted > 0 and r.finish.name == "STOP_TOKEN"
    ]
    assert ending, "no speculative round accepted drafts and then stopped at EOS"
    assert any(c["finish_reason"] == "stop" for c in body["choices"])


def test_each_streamed_chunk_carries_the_entries_of_its_own_tokens(servers):
    """sglang #39260 repeated the first token's list on every token of a speculative step."""
    _, speculative_client, watch = servers
    request = {"prompt": prompt(3), "max_tokens": 24, "logprobs": 3, "stream": True, **GREEDY}
    start = len(watch.records)
    whole = post(speculative_client, **{**request, "stream": False})

    status, text = stream_post(speculative_client.app, "/v1/completions", json=request)

    assert status == 200 and watch.accepted_since(start) > 0
    joined = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for frame in json_frames(text):
        logprobs = frame["choices"][0]["logprobs"] if frame["choices"] else None
        if logprobs is None:
            continue
        assert len(set(map(len, logprobs.values()))) == 1
        for key in joined:
            joined[key] += logprobs[key]
    assert joined == whole["choices"][0]["logprobs"]
    assert len(set(map(str, joined["top_logprobs"]))) > 1
