"""`GET /metrics` over a real tiny model: after known requests every series has an exact value.

One module-scoped scenario sends them all (generations with exact token counts, a stop, a
preemption, logprobs, a scored prompt, a stream its client drops, and rejected requests), then
each test checks one group of series.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from falcon import testing

from adapters.cli.asgi import load_served_model
from adapters.cli.serve_config import ServeConfig
from adapters.gpu.factory import RunnerSettings
from adapters.gpu.model.config import ModelConfig
from adapters.gpu.model.kv_cache import PagedKVCache
from adapters.http.app import create_app
from adapters.http.errors import rejection_reason
from adapters.http.serving import HttpSettings, ModelHolder, ServedModel
from adapters.metrics.prometheus import PrometheusMetrics
from domain.common.errors import (
    AuthenticationError,
    InvalidRequestError,
    NotFoundError,
    NotReadyError,
    OverloadedError,
    PayloadTooLargeError,
    RequestFailedError,
)
from domain.contract.records import DEFAULT_TOKEN_CAPACITY
from domain.logprobs.prompt_scores import PROMPT_ROW_WORDS
from domain.logprobs.values import NATURAL_TOP_K
from domain.requests.engine_request import CheckedRequest
from tests.support.draining import wait_until_idle
from tests.support.prometheus import Scrape
from tests.support.step_gate import StepGate

MODEL = "tiny"
KEY = "sk-metrics"
AUTH = {"Authorization": f"Bearer {KEY}"}
BLOCK_SIZE = 8
# 16 blocks of 8 hold exactly one sequence of MAX_MODEL_LEN: two choices of 84 positions cannot
# both stay, so the newer is preempted once and waits until the older one ends.
NUM_BLOCKS = 16
MAX_MODEL_LEN = 128
MAX_BODY_BYTES = 4096
GREEDY = {"temperature": 0, "ignore_eos": True}
# One requesting lane's read: T positions of the chosen pair plus K natural pairs, int32 words.
LOGPROB_READ_BYTES = DEFAULT_TOKEN_CAPACITY * (2 + 2 * NATURAL_TOP_K) * 4
PROMPT_ROW_BYTES = PROMPT_ROW_WORDS * 4

PLAIN = [40, 41, 42, 43]
STOPPING = [50, 51, 52]
STOP_TOKEN = 60
WITH_LOGPROBS = [44, 45, 46, 47, 48]
SCORED = [30, 31, 32, 33, 34, 35]
PREEMPTED = [20, 21, 22, 23]
PREEMPTED_TOKENS = 80
DROPPED = [24, 25, 26]


@pytest.fixture(scope="module")
def metered(http_model_dir: Path) -> Iterator[tuple[ServedModel, PrometheusMetrics]]:
    block_bytes = PagedKVCache.bytes_per_block(
        ModelConfig.from_dir(http_model_dir), BLOCK_SIZE, torch.float32
    )
    config = ServeConfig(
        model=str(http_model_dir),
        served_model_name=MODEL,
        runner=RunnerSettings(
            device="cpu",
            max_num_seqs=4,
            max_model_len=MAX_MODEL_LEN,
            kv_cache_bytes=NUM_BLOCKS * block_bytes,
            block_size=BLOCK_SIZE,
            prompt_logprobs=True,
        ),
    )
    metrics = PrometheusMetrics(MODEL)
    served = load_served_model(config, metrics)
    yield served, metrics
    served.stop()


def word_token(served: ServedModel) -> int:
    """The lowest token ID whose bytes are two or more ASCII letters: text in every chunk."""
    tokenizer = served.tokenizer
    return next(
        token_id
        for token_id in range(tokenizer.vocab_size)
        if len(raw := tokenizer.token_bytes(token_id)) > 1 and raw.isascii() and raw.isalpha()
    )


async def _until(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.005)


async def _drop_a_stream(app, served: ServedModel, body: dict) -> tuple[str, int]:
    """Streams `body`, leaves after the first chunk, and returns it with the number of tokens
    the request generated before its abort.

    Steps run one at a time. The server notices a client has gone only when it sends the next
    chunk, so the second step runs after the client left; the abort then reaches the engine
    either before its third step plans (two tokens) or while that step waits at the gate
    (three tokens). The test sees which, so the count is exact either way.
    """
    engine = served.engine
    gate = StepGate(engine._executor)  # noqa: SLF001 - the test drives the real executor
    aborted = threading.Event()
    abort = engine.abort

    def spying_abort(request_id: str) -> None:
        abort(request_id)
        aborted.set()

    engine.abort = spying_abort
    try:
        async with testing.ASGIConductor(app) as conductor:
            result = await conductor.simulate_request(
                "POST", "/v1/completions", _stream_result=True, json=body, headers=AUTH
            )
            await gate.reached(1)
            gate.allow(1)  # prefill and the first token
            received = b""
            while b"data:" not in received:
                received += await result.stream.read()
            await gate.reached(2)
            leaving = asyncio.create_task(result.finalize())  # the client disconnects
            # Falcon's watcher polls for the disconnect every millisecond; this timer fires
            # after it has seen it, so the second token's chunk is where the server stops.
            await asyncio.sleep(0.05)
            gate.allow(1)
            await _until(aborted.is_set, "leaving the stream never aborted it")
            await _until(
                lambda: gate.arrivals >= 3 or not engine.has_work(),
                "the engine neither parked nor went idle",
            )
            steps = gate.arrivals
            if steps >= 3:
                gate.allow(1)  # the third token; the step after it drains the abort
            await leaving
            await asyncio.to_thread(wait_until_idle, served.engine)
    finally:
        del engine.abort
        gate.remove()
    return received.decode(), min(steps, 3)


@pytest.fixture(scope="module")
def scenario(metered) -> dict:
    """Sends every request once and returns what the responses said, plus the final scrape."""
    served, metrics = metered
    app = create_app(
        ModelHolder(served=served),
        HttpSettings(api_key=KEY, max_body_bytes=MAX_BODY_BYTES),
        metrics,
    )
    client = testing.TestClient(app)

    def post(path: str, body: dict, headers: dict | None = AUTH):
        return client.simulate_post(path, json=body, headers=headers)

    said = {}
    said["plain"] = post("/v1/completions", {"prompt": PLAIN, "max_tokens": 5, **GREEDY})
    said["chat"] = post(
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, **GREEDY},
    )
    said["stop"] = post(
        "/v1/completions",
        {
            "prompt": STOPPING,
            "max_tokens": 10,
            "temperature": 0,
            "logit_bias": {str(STOP_TOKEN): 100},
            "stop_token_ids": [STOP_TOKEN],
        },
    )
    said["logprobs"] = post(
        "/v1/completions", {"prompt": WITH_LOGPROBS, "max_tokens": 3, "logprobs": 2, **GREEDY}
    )
    said["scored"] = post(
        "/v1/completions",
        {"prompt": SCORED, "echo": True, "logprobs": 1, "max_tokens": 1, **GREEDY},
    )
    said["preempted"] = post(
        "/v1/completions",
        {"prompt": PREEMPTED, "n": 2, "max_tokens": PREEMPTED_TOKENS, **GREEDY},
    )
    said["dropped"], said["dropped_tokens"] = asyncio.run(
        _drop_a_stream(
            app,
            served,
            {
                "prompt": DROPPED,
                "max_tokens": 100,
                "stream": True,
                "logit_bias": {str(word_token(served)): 100},
                **GREEDY,
            },
        )
    )
    said["rejected"] = [
        post("/v1/completions", {"prompt": "hi", "temperature": "hot"}),
        post("/v1/completions", {"prompt": [999], "max_tokens": 1}),
        post("/v1/completions", {"model": "gpt-9", "prompt": "hi"}),
        client.simulate_get("/v1/nothing", headers=AUTH),
        client.simulate_get("/v1/models"),
        client.simulate_delete("/v1/completions", headers=AUTH),
        post("/v1/completions", {"prompt": "x" * MAX_BODY_BYTES}),
    ]
    wait_until_idle(served.engine)
    scrape = client.simulate_get("/metrics", headers=AUTH)
    said["scrape"] = scrape
    said["metrics"] = Scrape(scrape.text)
    return said


def value(scenario: dict, name: str, **labels: str) -> float:
    return scenario["metrics"].value(name, model_name=MODEL, **labels)


@pytest.mark.model
def test_the_requests_answered_as_the_scenario_assumes(scenario):
    usage = {name: scenario[name].json["usage"] for name in ("plain", "stop", "preempted")}

    assert usage["plain"]["completion_tokens"] == 5
    assert scenario["stop"].json["choices"][0]["finish_reason"] == "stop"
    assert usage["stop"]["completion_tokens"] == 1
    assert usage["preempted"]["completion_tokens"] == 2 * PREEMPTED_TOKENS
    assert scenario["chat"].json["usage"]["completion_tokens"] == 3
    assert len(scenario["logprobs"].json["choices"][0]["logprobs"]["tokens"]) == 3
    assert scenario["scored"].json["choices"][0]["logprobs"]["token_logprobs"][0] is None
    assert "data:" in scenario["dropped"] and "[DONE]" not in scenario["dropped"]
    assert scenario["dropped_tokens"] in (2, 3)
    assert [r.status_code for r in scenario["rejected"]] == [400, 400, 404, 404, 401, 405, 413]


@pytest.mark.model
def test_the_scrape_is_prometheus_text_with_the_model_name_on_every_series(scenario):
    scrape = scenario["scrape"]

    assert scrape.status_code == 200
    assert scrape.headers["content-type"].startswith("text/plain; version=0.0.4")
    for family in scenario["metrics"].families.values():
        assert all(sample.labels["model_name"] == MODEL for sample in family.samples)


@pytest.mark.model
def test_the_gauges_are_back_to_zero_once_every_request_ended(scenario):
    assert value(scenario, "vllm:num_requests_running") == 0
    assert value(scenario, "vllm:num_requests_waiting") == 0
    assert value(scenario, "vllm:kv_cache_usage_perc") == 0


@pytest.mark.model
def test_token_counters_add_every_choice_s_prompt_and_generated_tokens(scenario):
    chat_prompt = scenario["chat"].json["usage"]["prompt_tokens"]
    prompts = [PLAIN, STOPPING, WITH_LOGPROBS, SCORED, PREEMPTED, PREEMPTED, DROPPED]
    generated = 5 + 3 + 1 + 3 + 1 + 2 * PREEMPTED_TOKENS + scenario["dropped_tokens"]

    assert value(scenario, "vllm:prompt_tokens_total") == chat_prompt + sum(map(len, prompts))
    assert value(scenario, "vllm:generation_tokens_total") == generated


@pytest.mark.model
def test_every_choice_finished_once_with_its_reason(scenario):
    def finished(reason: str) -> float:
        return value(scenario, "vllm:request_success_total", finished_reason=reason)

    assert finished("stop") == 1
    assert finished("length") == 6  # plain, chat, logprobs, scored and both preempted choices
    assert finished("abort") == 1
    assert finished("error") == 0


@pytest.mark.model
def test_the_small_kv_pool_preempted_exactly_once(scenario):
    assert value(scenario, "vllm:num_preemptions_total") == 1


@pytest.mark.model
def test_histograms_count_one_observation_per_choice_or_per_later_token(scenario):
    choices = 8
    dropped = scenario["dropped_tokens"] - 1
    later_tokens = (5 - 1) + (3 - 1) + 0 + (3 - 1) + 0 + 2 * (PREEMPTED_TOKENS - 1) + dropped

    for name in (
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
    ):
        assert value(scenario, f"{name}_count") == choices, name
        assert value(scenario, f"{name}_bucket", le="+Inf") == choices, name
    assert value(scenario, "vllm:inter_token_latency_seconds_count") == later_tokens
    assert value(scenario, "vllm:inter_token_latency_seconds_sum") > 0


@pytest.mark.model
def test_logprob_counters_count_positions_bytes_and_scored_rows(scenario):
    # Three positions of the logprobs request, one generated by the scored request.
    assert value(scenario, "helios:logprob_positions_total") == 3 + 1
    assert (
        value(scenario, "helios:logprob_payload_bytes_total")
        == 4 * LOGPROB_READ_BYTES + len(SCORED) * PROMPT_ROW_BYTES
    )
    assert value(scenario, "helios:prompt_rows_scored_total") == len(SCORED) - 1


@pytest.mark.model
def test_rejected_requests_count_by_reason(scenario):
    def rejected(reason: str) -> float:
        return value(scenario, "helios:requests_rejected_total", reason=reason)

    assert rejected("invalid_request") == 2
    assert rejected("not_found") == 2
    assert rejected("unauthorized") == 1
    assert rejected("method_not_allowed") == 1
    assert rejected("too_large") == 1
    reasons = {
        sample.labels["reason"]
        for sample in scenario["metrics"].families["helios:requests_rejected"].samples
    }
    assert reasons == {
        "invalid_request",
        "not_found",
        "unauthorized",
        "method_not_allowed",
        "too_large",
    }


def test_metrics_answer_while_the_model_loads_and_count_the_refusals():
    client = testing.TestClient(create_app(ModelHolder()))

    health = client.simulate_get("/health")
    scrape = client.simulate_get("/metrics")

    assert health.status_code == 503
    assert scrape.status_code == 200
    found = Scrape(scrape.text)
    assert found.value("helios:requests_rejected_total", model_name="", reason="not_ready") == 1


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (InvalidRequestError("bad"), "invalid_request"),
        (AuthenticationError("who"), "unauthorized"),
        (NotFoundError("gone"), "not_found"),
        (PayloadTooLargeError("big"), "too_large"),
        (OverloadedError("full"), "overloaded"),
        (NotReadyError("loading"), "not_ready"),
        (RequestFailedError("broke"), "internal_error"),
    ],
)
def test_each_error_has_its_rejection_reason(error, reason):
    assert rejection_reason(error) == reason


@pytest.mark.model
def test_an_overloaded_engine_s_503_is_counted_as_overloaded(served):
    class Full:
        max_model_len = served.engine.max_model_len
        submit_waits = False

        def check(self, request):
            return CheckedRequest(request, self)

        def submit_all(self, submissions):
            raise OverloadedError("the server is at its admission limit; retry later")

        def abort(self, request_id):
            return None

    full = ServedModel(MODEL, served.tokenizer, Full())
    metrics = PrometheusMetrics(MODEL)
    client = testing.TestClient(create_app(ModelHolder(served=full), metrics=metrics))

    answer = client.simulate_post("/v1/completions", json={"prompt": "hi", "max_tokens": 1})
    found = Scrape(client.simulate_get("/metrics").text)

    assert answer.status_code == 503
    assert found.value("helios:requests_rejected_total", model_name=MODEL, reason="overloaded") == 1


@pytest.mark.model
def test_prefix_cache_counters_count_every_lookup_in_prompt_tokens(scenario):
    chat_prompt = scenario["chat"].json["usage"]["prompt_tokens"]
    # Every admission looks up its whole prompt, the preempted choice's readmission too; the
    # scored prompt computes every row and looks up nothing. No two prompts share a full block.
    looked_up = [PLAIN, STOPPING, WITH_LOGPROBS, PREEMPTED, PREEMPTED, PREEMPTED, DROPPED]

    assert value(scenario, "vllm:prefix_cache_queries_total") == chat_prompt + sum(
        map(len, looked_up)
    )
    assert value(scenario, "vllm:prefix_cache_hits_total") == 0
