"""`helios serve --tensor-parallel-size 2` end to end: official client, dead peers, tp-worker."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from domain.emission.outputs import ChoiceDelta
from domain.logprobs.rules import LogprobAsk
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams
from tests.e2e.conftest import (
    REPO_ROOT,
    RunningServer,
    free_port,
    health_status,
    running_server,
    server_environment,
)
from tests.support.completion_checks import check_completion_logprobs
from tests.support.draining import drain
from tests.support.engines import build_engine
from tests.support.tiny_serving import build_parallel_model_dir

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.model]

SMOLLM2 = "SmolLM2-135M-Instruct"
# Long enough for a fresh peer interpreter to import torch on a loaded 2-core machine, short
# enough that a hung peer fails the step quickly.
COLLECTIVE_TIMEOUT_S = 15.0
# Two ranks of SmolLM2 load, and a restarted worker loads again, on cores other tests share.
READY_TIMEOUT_S = 120.0
CLIENT_TIMEOUT_S = 90.0
QUESTION = [{"role": "user", "content": "Name three fruits and say why they are good."}]
PROMPT = "The capital of France is"
# Split noise between one rank and two (FP32 summation order), as the integration tests allow.
SPLIT_NOISE = 5e-5


def client_of(server: RunningServer) -> openai.OpenAI:
    # No retries: a retried request would hide the very failure a test looks for.
    return openai.OpenAI(
        base_url=f"{server.base_url}/v1", api_key="x", max_retries=0, timeout=CLIENT_TIMEOUT_S
    )


def children(pid: int) -> list[int]:
    found: list[int] = []
    for path in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            found += [int(child) for child in path.read_text().split()]
    return found


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state (R, S, T, Z...), None once the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def serving_worker(server: RunningServer) -> int:
    """The gunicorn worker: the master's only child (rank 0 of the world)."""
    [worker] = children(server.pid)
    return worker


def peers_of(worker: int) -> list[int]:
    """The peer ranks the worker started: `helios tp-worker` (or multiprocessing spawn) children."""
    return [
        child
        for child in children(worker)
        if "tp-worker" in command_line(child) or "multiprocessing.spawn" in command_line(child)
    ]


def peer_rank(worker: int) -> int:
    peers = peers_of(worker)
    assert len(peers) == 1, [command_line(child) for child in children(worker)]
    return peers[0]


def wait_for(condition, timeout_s: float, what: str, server: RunningServer):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(0.1)
    pytest.fail(f"{what} not within {timeout_s:.0f} s:\n{server.log()}", pytrace=False)


def check_recovery(server: RunningServer, old_worker: int, old_peer: int) -> None:
    """The failed worker exited with a non-zero status, gunicorn booted a fresh one with a
    fresh peer, /health is 200 again and a request succeeds."""
    wait_for(
        lambda: f"Worker (pid:{old_worker}) exited with code 70" in server.log(),
        30,
        "the failed worker's exit",
        server,
    )
    wait_for(lambda: health_status(server.base_url) == 200, READY_TIMEOUT_S, "recovery", server)
    worker = serving_worker(server)
    assert worker != old_worker
    assert f"Booting worker with pid: {worker}" in server.log()
    assert peer_rank(worker) != old_peer
    # The old peer is gone, not left stopped or hung beside the new world.
    assert process_state(old_peer) in (None, "Z", "X")
    reply = client_of(server).chat.completions.create(
        model=SMOLLM2, messages=QUESTION, max_tokens=8, temperature=0, logprobs=True
    )
    assert reply.usage.completion_tokens == 8
    assert len(reply.choices[0].logprobs.content) == 8


# Two independently started process groups meeting on loopback: first in the module, so that
# the SmolLM2 server starts only after these have stopped.


@pytest.fixture(scope="module")
def parallel_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_parallel_model_dir(tmp_path_factory.mktemp("tp-model"))


LOOPBACK_PROMPT = [7, 300, 1200, 2499, 42, 1800, 5, 999]
LOOPBACK_REQUEST = dict(
    prompt=LOOPBACK_PROMPT,
    max_tokens=16,
    temperature=0,
    logprobs=3,
    extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True},
)


@dataclass
class LoopbackWorld:
    server: RunningServer
    workers: list[subprocess.Popen]
    start_worker: Callable[[], subprocess.Popen]


@contextlib.contextmanager
def separate_process_groups(model_dir: Path, workdir: Path) -> Iterator[LoopbackWorld]:
    """`helios serve MODEL -tp 2 --tensor-parallel-local-ranks 1` and, started apart from it,
    `helios tp-worker` as rank 1, meeting at MASTER_ADDR:MASTER_PORT on loopback; afterwards
    every tp-worker started through the handle has been stopped."""
    rendezvous = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    workers: list[subprocess.Popen] = []

    def start_worker() -> subprocess.Popen:
        log_path = workdir / f"tp-worker{len(workers)}.log"
        with log_path.open("wb") as log:
            workers.append(
                subprocess.Popen(
                    [sys.executable, "-m", "adapters.cli.main", "tp-worker", "--device", "cpu"],
                    cwd=REPO_ROOT,
                    env={
                        **server_environment(workdir),
                        **rendezvous,
                        "WORLD_SIZE": "2",
                        "RANK": "1",
                        "LOCAL_RANK": "0",
                    },
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        return workers[-1]

    start_worker()
    try:
        with running_server(
            model_dir,
            workdir,
            "--tensor-parallel-size",
            "2",
            "--tensor-parallel-local-ranks",
            "1",
            environment=rendezvous,
            ready_timeout_s=READY_TIMEOUT_S,
        ) as server:
            yield LoopbackWorld(server, workers, start_worker)
    finally:
        for worker in workers:
            if worker.poll() is None:
                try:
                    worker.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    worker.kill()
                    worker.wait()


def served_token_ids(reply) -> list[int]:
    return [int(token.removeprefix("token_id:")) for token in reply.choices[0].logprobs.tokens]


def test_a_server_and_a_separately_started_tp_worker_meet_on_loopback_and_serve_one_ranks_tokens(
    parallel_model_dir: Path, tmp_path: Path
):
    with separate_process_groups(parallel_model_dir, tmp_path) as world:
        # The serving worker spawned no peer of its own: rank 1 is the process started apart.
        assert peers_of(serving_worker(world.server)) == []
        reply = client_of(world.server).completions.create(
            model=str(parallel_model_dir), **LOOPBACK_REQUEST
        )
    [worker] = world.workers

    engine, _, _ = build_engine(parallel_model_dir)
    one_rank = EngineRequest(
        "one-rank",
        tuple(LOOPBACK_PROMPT),
        SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True),
        logprobs=LogprobAsk(wanted=True, count=3),
    )
    deltas = [i for i in drain(engine, [one_rank])["one-rank"] if isinstance(i, ChoiceDelta)]
    expected = [entry.position.chosen.logprob for delta in deltas for entry in delta.logprobs]

    # Stopping the server stopped the tp-worker too, cleanly.
    assert worker.returncode == 0, (tmp_path / "tp-worker0.log").read_text(errors="replace")
    assert served_token_ids(reply) == [token for delta in deltas for token in delta.token_ids]
    for value, reference in zip(reply.choices[0].logprobs.token_logprobs, expected, strict=True):
        assert abs(value - reference) <= SPLIT_NOISE


def test_a_tp_worker_started_again_after_its_predecessor_died_joins_the_restarted_world(
    parallel_model_dir: Path, tmp_path: Path
):
    with separate_process_groups(parallel_model_dir, tmp_path) as world:
        client = client_of(world.server)
        before = client.completions.create(model=str(parallel_model_dir), **LOOPBACK_REQUEST)
        old_worker = serving_worker(world.server)
        world.workers[0].kill()
        world.workers[0].wait()

        with pytest.raises(openai.InternalServerError, match="tensor-parallel"):
            client.completions.create(model=str(parallel_model_dir), **LOOPBACK_REQUEST)
        wait_for(
            lambda: f"Worker (pid:{old_worker}) exited with code 70" in world.server.log(),
            30,
            "the failed worker's exit",
            world.server,
        )
        world.start_worker()
        wait_for(
            lambda: health_status(world.server.base_url) == 200,
            READY_TIMEOUT_S,
            "the restarted world",
            world.server,
        )
        assert serving_worker(world.server) != old_worker
        after = client.completions.create(model=str(parallel_model_dir), **LOOPBACK_REQUEST)

    assert served_token_ids(after) == served_token_ids(before)
    assert world.workers[1].returncode == 0


# One SmolLM2 server on two ranks for the rest of the module; the fault tests come last and
# leave it recovered.


@pytest.fixture(scope="module")
def smollm2_tp2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    workdir = tmp_path_factory.mktemp("smollm2-tp2")
    with running_server(
        None,
        workdir,
        "--kv-cache-memory",
        str(64 << 20),
        "--tensor-parallel-size",
        "2",
        "--prompt-logprobs",
        "--collective-timeout",
        str(COLLECTIVE_TIMEOUT_S),
        ready_timeout_s=READY_TIMEOUT_S,
    ) as server:
        yield server


@pytest.fixture(scope="module")
def client(smollm2_tp2: RunningServer) -> openai.OpenAI:
    return client_of(smollm2_tp2)


def test_two_ranks_serve_a_greedy_chat_with_top_5_logprobs_that_spell_the_reply(client):
    reply = client.chat.completions.create(
        model=SMOLLM2,
        messages=QUESTION,
        max_tokens=24,
        temperature=0,
        logprobs=True,
        top_logprobs=5,
        extra_body={"ignore_eos": True},
    )

    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens == 24
    raw = b"".join(bytes(entry.bytes) for entry in content)
    assert raw.decode("utf-8") == reply.choices[0].message.content
    for entry in content:
        values = [top.logprob for top in entry.top_logprobs]
        assert len(values) == 5
        assert values == sorted(values, reverse=True)
        assert all(math.isfinite(v) and v <= 0 for v in values)
        # Greedy: the chosen token is the most likely one.
        assert entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == entry.logprob


def test_two_ranks_serve_completion_logprobs_that_index_into_the_text(client):
    reply = client.completions.create(
        model=SMOLLM2,
        prompt=PROMPT,
        max_tokens=16,
        temperature=0,
        logprobs=5,
        extra_body={"ignore_eos": True},
    )

    assert reply.usage.completion_tokens == 16
    check_completion_logprobs(reply.choices[0], 16, top_k=5)


def test_two_ranks_stream_chat_logprobs_equal_to_the_whole_reply(client):
    request = dict(
        model=SMOLLM2,
        messages=QUESTION,
        max_tokens=20,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        extra_body={"ignore_eos": True},
    )
    whole = client.chat.completions.create(**request)

    streamed, text = [], ""
    for chunk in client.chat.completions.create(**request, stream=True):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            if chunk.choices[0].logprobs is not None:
                streamed += chunk.choices[0].logprobs.content

    assert text == whole.choices[0].message.content
    assert b"".join(bytes(entry.bytes) for entry in streamed).decode("utf-8") == text
    assert [e.model_dump() for e in streamed] == [
        e.model_dump() for e in whole.choices[0].logprobs.content
    ]


def test_two_ranks_score_an_echoed_prompt_as_they_generate_it(client):
    generated = client.completions.create(
        model=SMOLLM2,
        prompt=PROMPT,
        max_tokens=6,
        temperature=0,
        logprobs=1,
        extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True},
    ).choices[0]
    prompt_ids = [
        int(token.removeprefix("token_id:"))
        for token in client.completions.create(
            model=SMOLLM2,
            prompt=PROMPT,
            max_tokens=0,
            echo=True,
            logprobs=0,
            extra_body={"return_tokens_as_token_ids": True},
        )
        .choices[0]
        .logprobs.tokens
    ]
    continuation = [int(t.removeprefix("token_id:")) for t in generated.logprobs.tokens]

    scored = client.completions.create(
        model=SMOLLM2,
        prompt=prompt_ids + continuation,
        max_tokens=0,
        echo=True,
        logprobs=1,
        extra_body={"return_tokens_as_token_ids": True},
    )

    logprobs = scored.choices[0].logprobs
    assert scored.usage.completion_tokens == 0
    assert logprobs.tokens == [f"token_id:{t}" for t in prompt_ids + continuation]
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    for token, value, top in zip(
        logprobs.tokens[1:], logprobs.token_logprobs[1:], logprobs.top_logprobs[1:], strict=True
    ):
        assert math.isfinite(value) and value <= 0
        assert top[token] == value and 1 <= len(top) <= 2
    # The scored prefill and the decode steps exchange different words over the ranks, yet
    # agree on the continuation's logprobs within a prefill's FP32 noise.
    for value, reference in zip(
        logprobs.token_logprobs[-len(continuation) :],
        generated.logprobs.token_logprobs,
        strict=True,
    ):
        assert abs(value - reference) <= 1e-3


def test_two_ranks_serve_structured_outputs_with_the_model_s_own_logprobs(client):
    choice = client.completions.create(
        model=SMOLLM2,
        prompt=PROMPT,
        max_tokens=8,
        temperature=0,
        logprobs=3,
        extra_body={"structured_outputs": {"choice": [" Paris", " Lyon", " Rome"]}},
    ).choices[0]
    record = client.chat.completions.create(
        model=SMOLLM2,
        messages=[{"role": "user", "content": "Give a city and its country as JSON."}],
        max_tokens=40,
        temperature=0.7,
        seed=5,
        response_format={
            "type": "json_schema",
            "json_schema": {
                "name": "place",
                "schema": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string", "maxLength": 12},
                        "country": {"enum": ["France", "Italy", "Spain"]},
                    },
                    "required": ["city", "country"],
                    "additionalProperties": False,
                },
            },
        },
    ).choices[0]

    assert choice.text in (" Paris", " Lyon", " Rome")
    # Raw values: the model's own distribution, which a mask does not renormalize.
    assert all(math.isfinite(v) and v <= 0 for v in choice.logprobs.token_logprobs)
    place = json.loads(record.message.content)
    assert place["country"] in ("France", "Italy", "Spain") and len(place["city"]) <= 12


def test_killing_the_peer_rank_mid_stream_fails_the_stream_at_once_and_gunicorn_restarts_the_world(
    smollm2_tp2: RunningServer, client
):
    worker = serving_worker(smollm2_tp2)
    peer = peer_rank(worker)
    started = threading.Event()
    outcome: dict[str, object] = {}

    def stream() -> None:
        chunks = 0
        try:
            for _ in client.completions.create(
                model=SMOLLM2,
                prompt=PROMPT,
                max_tokens=200,
                temperature=0,
                stream=True,
                extra_body={"ignore_eos": True},
            ):
                chunks += 1
                if chunks == 3:
                    started.set()
            outcome["error"] = None
        except openai.APIError as error:
            outcome["error"] = error
        outcome["failed_at"] = time.monotonic()
        started.set()

    reader = threading.Thread(target=stream)
    reader.start()
    assert started.wait(CLIENT_TIMEOUT_S)
    killed_at = time.monotonic()
    os.kill(peer, signal.SIGKILL)
    reader.join(CLIENT_TIMEOUT_S)
    unhealthy = health_status(smollm2_tp2.base_url)

    assert not reader.is_alive()
    assert isinstance(outcome["error"], openai.APIError), outcome
    assert "tensor-parallel" in str(outcome["error"])
    seconds = outcome["failed_at"] - killed_at  # type: ignore[operator]
    print(f"\nkill to failed stream: {seconds:.2f} s")
    assert seconds < COLLECTIVE_TIMEOUT_S
    assert unhealthy == 503
    check_recovery(smollm2_tp2, worker, peer)


def test_a_hung_peer_rank_fails_the_next_request_within_the_collective_timeout(
    smollm2_tp2: RunningServer, client
):
    worker = serving_worker(smollm2_tp2)
    peer = peer_rank(worker)
    os.kill(peer, signal.SIGSTOP)
    try:
        stopped_at = time.monotonic()
        with pytest.raises(openai.InternalServerError, match="tensor-parallel") as failure:
            client.completions.create(model=SMOLLM2, prompt=PROMPT, max_tokens=4, temperature=0)
        seconds = time.monotonic() - stopped_at
        unhealthy = health_status(smollm2_tp2.base_url)

        print(f"\nhung peer to failed request: {seconds:.2f} s ({failure.value.message[:80]})")
        assert seconds < COLLECTIVE_TIMEOUT_S + 5
        assert unhealthy == 503
        check_recovery(smollm2_tp2, worker, peer)
    finally:
        if process_state(peer) == "T":
            os.kill(peer, signal.SIGKILL)
