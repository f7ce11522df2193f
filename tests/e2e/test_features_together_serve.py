"""Three serving features at once: `--tensor-parallel-size 2 --api-server-count 2
--async-scheduling` on a tiny model. Both API processes answer with one rank's tokens, a stream
equals its whole answer, and a constrained request (checked and compiled in the engine process,
its steps synchronous under the overlapped loop, its masks on both ranks) keeps its grammar."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from domain.emission.outputs import ChoiceDelta
from domain.logprobs.rules import LogprobAsk
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams
from tests.e2e.conftest import RunningServer, running_server
from tests.e2e.test_tensor_parallel_serve import READY_TIMEOUT_S, SPLIT_NOISE
from tests.support.draining import drain
from tests.support.engines import build_engine
from tests.support.sse import data_frames
from tests.support.tiny_serving import build_parallel_model_dir

pytestmark = [pytest.mark.e2e, pytest.mark.model, pytest.mark.slow]

MODEL = "together"
HEADER = "x-helios-api-server"
PROMPT = [7, 300, 1200, 2499, 42, 1800, 5, 999]
GREEDY = {
    "model": MODEL,
    "prompt": PROMPT,
    "max_tokens": 16,
    "temperature": 0,
    "logprobs": 3,
    "ignore_eos": True,
    "return_tokens_as_token_ids": True,
}
# Fresh connections until both API processes have answered.
ATTEMPTS = 40


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_parallel_model_dir(tmp_path_factory.mktemp("together-model"))


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    arguments = (
        "--tensor-parallel-size",
        "2",
        "--api-server-count",
        "2",
        "--async-scheduling",
        "--served-model-name",
        MODEL,
    )
    workdir = tmp_path_factory.mktemp("together")
    with running_server(model_dir, workdir, *arguments, ready_timeout_s=READY_TIMEOUT_S) as up:
        yield up


def post(server: RunningServer, body: dict) -> tuple[int, str, int]:
    """(status, body text, serving process) of one completion on a connection of its own."""
    parts = urlsplit(server.base_url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        headers = {"Content-Type": "application/json"}
        connection.request("POST", "/v1/completions", json.dumps(body), headers)
        response = connection.getresponse()
        return response.status, response.read().decode(), int(response.getheader(HEADER))
    finally:
        connection.close()


def one_rank(model_dir: Path) -> tuple[list[int], list[float]]:
    engine, _, _ = build_engine(model_dir)
    request = EngineRequest(
        "one-rank",
        tuple(PROMPT),
        SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True),
        logprobs=LogprobAsk(wanted=True, count=3),
    )
    deltas = [i for i in drain(engine, [request])["one-rank"] if isinstance(i, ChoiceDelta)]
    tokens = [token for delta in deltas for token in delta.token_ids]
    return tokens, [entry.position.chosen.logprob for d in deltas for entry in d.logprobs]


def test_both_api_processes_serve_one_rank_s_tokens_from_the_split_overlapped_engine(
    server: RunningServer, model_dir: Path
):
    answers, processes = set(), set()
    for _ in range(ATTEMPTS):
        status, text, process = post(server, GREEDY)
        assert status == 200, text
        body = {k: v for k, v in json.loads(text).items() if k not in ("id", "created")}
        answers.add(json.dumps(body, sort_keys=True))
        processes.add(process)
        if len(processes) == 2:
            break

    assert len(processes) == 2 and len(answers) == 1
    logprobs = json.loads(answers.pop())["choices"][0]["logprobs"]
    tokens, values = one_rank(model_dir)
    assert [int(t.removeprefix("token_id:")) for t in logprobs["tokens"]] == tokens
    for served, reference in zip(logprobs["token_logprobs"], values, strict=True):
        assert abs(served - reference) <= SPLIT_NOISE


def test_a_stream_equals_its_whole_answer(server: RunningServer):
    status, whole, _ = post(server, GREEDY)
    status_streamed, streamed, _ = post(server, {**GREEDY, "stream": True})

    assert (status, status_streamed) == (200, 200)
    frames = [json.loads(f) for f in data_frames(streamed) if f != "[DONE]"]
    choice = json.loads(whole)["choices"][0]
    assert "".join(f["choices"][0]["text"] for f in frames if f["choices"]) == choice["text"]
    streamed_tokens = [
        token for f in frames if f["choices"] for token in f["choices"][0]["logprobs"]["tokens"]
    ]
    assert streamed_tokens == choice["logprobs"]["tokens"]


def test_a_constrained_request_keeps_its_grammar_beside_plain_ones(server: RunningServer):
    options = ["alpha", "beta", "gamma"]
    constrained = {
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": 12,
        "temperature": 0,
        "structured_outputs": {"choice": options},
    }

    status, text, _ = post(server, constrained)
    plain_status, _, _ = post(server, GREEDY)

    assert (status, plain_status) == (200, 200), text
    assert json.loads(text)["choices"][0]["text"] in options
