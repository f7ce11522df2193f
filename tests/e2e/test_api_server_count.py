"""`helios serve --api-server-count 2`: two HTTP processes over one engine process."""

from __future__ import annotations

import http.client
import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.e2e.conftest import RunningServer, health_status, running_server
from tests.support.prometheus import Scrape

pytestmark = [pytest.mark.e2e, pytest.mark.model]

MODEL = "two-api"
HEADER = "x-helios-api-server"
HTTP_TIMEOUT_S = 30.0
# Fresh connections until both processes have answered: each accept goes to either, so 40
# misses in a row would take a broken balance (or one process).
ATTEMPTS = 40
TOGETHER = 16  # connections a client opens at once
LONG = 200  # tokens of a stream that is still running when the test acts on it
GREEDY = {"temperature": 0.0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def server(
    e2e_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    workdir = tmp_path_factory.mktemp("e2e-api-servers")
    arguments = ("--api-server-count", "2", "--served-model-name", MODEL)
    with running_server(e2e_model_dir, workdir, *arguments) as running:
        yield running


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict
    pid: int


def _connection(server: RunningServer) -> http.client.HTTPConnection:
    parts = urlsplit(server.base_url)
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=HTTP_TIMEOUT_S)


def post(server: RunningServer, path: str, body: dict) -> Answer:
    """One request on a connection of its own, so that either process may accept it."""
    connection = _connection(server)
    try:
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        return Answer(response.status, json.loads(response.read()), int(response.getheader(HEADER)))
    finally:
        connection.close()


def complete(server: RunningServer, prompt: str, max_tokens: int = 3) -> Answer:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    answer = post(server, "/v1/completions", body)
    assert answer.status == 200, answer.body
    return answer


class Stream:
    """A streamed completion read frame by frame; `pid` is the process that serves it."""

    def __init__(self, server: RunningServer, prompt: str, max_tokens: int) -> None:
        self._connection = _connection(server)
        body = {
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
        }
        self._connection.request(
            "POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        self._response = self._connection.getresponse()
        assert self._response.status == 200
        self.pid = int(self._response.getheader(HEADER))

    def frame(self) -> str:
        """The next `data:` payload."""
        for raw in self._response:
            line = raw.decode().strip()
            if line.startswith("data:"):
                return line[len("data:") :].strip()
        raise AssertionError("the stream ended without [DONE]")

    def rest(self) -> list[str]:
        frames = []
        while not frames or frames[-1] != "[DONE]":
            frames.append(self.frame())
        return frames

    def close(self) -> None:
        self._connection.close()


def scrape(server: RunningServer) -> tuple[Scrape, int]:
    connection = _connection(server)
    try:
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        assert response.status == 200
        return Scrape(response.read().decode()), int(response.getheader(HEADER))
    finally:
        connection.close()


def settled(server: RunningServer) -> Scrape:
    """A scrape once no request runs (the engine counts a step just after emitting it)."""
    deadline = time.monotonic() + 10
    while True:
        found, _ = scrape(server)
        idle = found.value("vllm:num_requests_running", model_name=MODEL) == 0
        if idle or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def finished(found: Scrape, reason: str) -> float:
    return found.value("vllm:request_success_total", model_name=MODEL, finished_reason=reason)


def test_the_official_client_answers_and_streams_with_logprobs(server: RunningServer) -> None:
    with server.openai_client(timeout=HTTP_TIMEOUT_S) as client:
        whole = client.completions.create(
            model=MODEL, prompt="The quick brown fox", max_tokens=6, logprobs=2, **GREEDY
        )
        chunks = list(
            client.completions.create(
                model=MODEL,
                prompt="The quick brown fox",
                max_tokens=6,
                logprobs=2,
                stream=True,
                **GREEDY,
            )
        )
        chat = list(
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Hello"}],
                max_tokens=4,
                logprobs=True,
                top_logprobs=3,
                stream=True,
                **GREEDY,
            )
        )

    streamed = [chunk.choices[0] for chunk in chunks if chunk.choices]
    assert "".join(choice.text for choice in streamed) == whole.choices[0].text
    tokens = [t for choice in streamed if choice.logprobs for t in choice.logprobs.tokens]
    assert tokens == whole.choices[0].logprobs.tokens
    assert whole.choices[0].finish_reason == streamed[-1].finish_reason == "length"
    entries = [
        e
        for c in chat
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert len(entries) == 4
    assert all(len(entry.top_logprobs) == 3 for entry in entries)


def test_requests_land_on_both_processes_and_metrics_count_each_once(
    server: RunningServer,
) -> None:
    before = settled(server)
    answers = [complete(server, f"request {number}") for number in range(12)]
    pids = {answer.pid for answer in answers}
    while len(pids) < 2 and len(answers) < ATTEMPTS:
        answers.append(complete(server, f"request {len(answers)}"))
        pids = {answer.pid for answer in answers}
    after = settled(server)
    scrapes = {}
    for _ in range(ATTEMPTS):
        found, pid = scrape(server)
        scrapes[pid] = found
        if len(scrapes) == 2:
            break

    assert len(pids) == 2, "every request went to one API process"
    assert server.pid not in pids
    assert set(scrapes) == pids, "both processes expose the metrics"
    served = len(answers)
    assert finished(after, "length") - finished(before, "length") == served
    generated = "vllm:generation_tokens_total"
    grown = after.value(generated, model_name=MODEL) - before.value(generated, model_name=MODEL)
    assert grown == 3 * served
    # Either process adds up the same files: the engine's counts once, not once a process.
    assert len({finished(found, "length") for found in scrapes.values()}) == 1


def test_kept_alive_connections_opened_together_spread_over_both_processes(
    server: RunningServer,
) -> None:
    # As a benchmark's or a gateway's pool opens them: all at once, each kept for many requests.
    connections = [_connection(server) for _ in range(TOGETHER)]
    try:
        for connection in connections:
            connection.connect()
        pids = []
        for connection in connections:
            connection.request("GET", "/v1/models")
            response = connection.getresponse()
            response.read()
            assert response.status == 200
            pids.append(int(response.getheader(HEADER)))
    finally:
        for connection in connections:
            connection.close()

    # The kernel hashes each connection to a process: all 16 on one is a 1 in 32,768 chance.
    assert len(set(pids)) == 2, f"all {TOGETHER} connections went to one API process"


def _nice_values(pid: int) -> set[int]:
    """The nice value of every thread of process `pid` (Linux keeps one per thread)."""
    values = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        stat = (task / "stat").read_text()
        # Fields after the command's closing parenthesis start at field 3; nice is field 19.
        values.add(int(stat[stat.rindex(")") + 2 :].split()[16]))
    return values


def test_every_thread_of_the_api_processes_runs_five_nice_steps_below_the_engine_process(
    server: RunningServer,
) -> None:
    answers = [complete(server, f"priority {number}") for number in range(4)]
    while len({answer.pid for answer in answers}) < 2 and len(answers) < ATTEMPTS:
        answers.append(complete(server, f"priority {len(answers)}"))
    api_pids = {answer.pid for answer in answers}
    engine = _engine_pid(server, api_pids)

    (base,) = _nice_values(engine)
    assert _nice_values(server.pid) == {base}
    for pid in api_pids:
        assert _nice_values(pid) == {min(base + 5, 19)}, f"API process {pid}"


def test_a_closed_stream_aborts_its_request_in_the_engine(server: RunningServer) -> None:
    before = settled(server)
    stream = Stream(server, "a stream the client leaves", LONG)
    stream.frame()
    stream.close()
    deadline = time.monotonic() + 10
    while finished(settled(server), "abort") == finished(before, "abort"):
        assert time.monotonic() < deadline, "the abort never reached the engine"
        time.sleep(0.05)

    later = complete(server, "after the abort", max_tokens=4)

    assert later.body["choices"][0]["finish_reason"] == "length"
    assert finished(settled(server), "abort") == finished(before, "abort") + 1


def test_a_follow_up_finds_its_previous_response_from_the_other_process(
    server: RunningServer,
) -> None:
    first = post(server, "/v1/responses", {"model": MODEL, "input": "Hi", "max_output_tokens": 4})
    assert first.status == 200, first.body
    follow_up = {
        "model": MODEL,
        "input": "And then?",
        "max_output_tokens": 4,
        "previous_response_id": first.body["id"],
    }
    for _ in range(ATTEMPTS):
        answer = post(server, "/v1/responses", follow_up)
        assert answer.status == 200, answer.body
        if answer.pid != first.pid:
            break

    assert answer.pid != first.pid, "no follow-up reached the other process"
    # It ran on the conversation it continued (to its token limit, or to an end of sequence:
    # the tiny model's weights are random).
    assert answer.body["status"] in {"completed", "incomplete"}
    assert answer.body["usage"]["input_tokens"] > first.body["usage"]["input_tokens"]
    assert answer.body["previous_response_id"] == first.body["id"]


def _streams_on_both(server: RunningServer) -> tuple[dict[int, Stream], int]:
    """A running stream on each process, and how many others were opened and left (each an
    abort in the engine)."""
    streams: dict[int, Stream] = {}
    left = 0
    for number in range(ATTEMPTS):
        stream = Stream(server, f"stream {number}", LONG)
        stream.frame()
        if stream.pid in streams:
            stream.close()
            left += 1
        else:
            streams[stream.pid] = stream
        if len(streams) == 2:
            return streams, left
    raise AssertionError("every stream went to one API process")


def test_killing_one_api_process_leaves_the_other_serving(server: RunningServer) -> None:
    aborted_before = finished(settled(server), "abort")
    streams, left = _streams_on_both(server)
    survivor, victim = sorted(streams)
    os.kill(victim, signal.SIGKILL)

    frames = streams[survivor].rest()
    streams[survivor].close()
    ends = [json.loads(frame)["choices"][0]["finish_reason"] for frame in frames[:-1]]
    deadline = time.monotonic() + 30
    fresh: set[int] = set()
    while not fresh:
        assert time.monotonic() < deadline, "gunicorn never brought a new API process up"
        fresh = {complete(server, "after the kill").pid} - {survivor, victim}

    assert ends[-1] == "length"
    assert not any('"error"' in frame for frame in frames)
    # The killed process's stream was aborted in the engine, and no other.
    assert finished(settled(server), "abort") == aborted_before + left + 1
    with urllib.request.urlopen(f"{server.base_url}/health", timeout=HTTP_TIMEOUT_S) as health:
        assert health.status == 200


def _engine_pid(server: RunningServer, api_pids: set[int]) -> int:
    """The gunicorn master's child that is no API process."""
    children = Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()
    (engine,) = {int(child) for child in children} - api_pids
    return engine


def test_a_dead_engine_process_makes_every_api_process_answer_503_then_the_server_exits(
    server: RunningServer,
) -> None:
    """Last in the module: it ends the server."""
    api_pids: set[int] = set()
    for number in range(ATTEMPTS):
        api_pids.add(complete(server, f"before {number}").pid)
        if len(api_pids) == 2:
            break
    assert len(api_pids) == 2, "every request went to one API process"
    os.kill(_engine_pid(server, api_pids), signal.SIGKILL)
    time.sleep(0.2)

    refused = post(server, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2})
    health = health_status(server.base_url)
    deadline = time.monotonic() + 20
    while health_status(server.base_url) is not None:
        assert time.monotonic() < deadline, "the server outlived its engine process"
        time.sleep(0.1)

    assert refused.status == 503
    assert refused.body["error"]["type"] == "ServiceUnavailableError"
    assert health == 503
