"""Serving throughput: N concurrent streaming chat clients against `helios serve`, N = 1, 4, 16.

Run: `.venv/bin/python bench/serve.py [--url URL] [--requests-per-client K] [--max-tokens M]`.
Without `--url` it starts `helios serve` (the embedded SmolLM2-135M, CPU) on a free port and
stops it at the end. Every request is greedy with EOS ignored, so it streams exactly M tokens;
each client sends its K requests one after another. Prints a markdown table and the ratio of
aggregate output tokens/s at the largest N to that at N = 1.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx2

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prompts import QUESTIONS  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 600.0
REQUEST_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class RequestTiming:
    """One streamed request: seconds to its first token, to its end, and tokens generated."""

    first_token_s: float
    total_s: float
    completion_tokens: int


@dataclass(frozen=True)
class LevelResult:
    """All requests of one concurrency level and the wall time they took together."""

    clients: int
    timings: list[RequestTiming]
    wall_s: float

    @property
    def requests_per_s(self) -> float:
        return len(self.timings) / self.wall_s

    @property
    def output_tokens_per_s(self) -> float:
        return sum(t.completion_tokens for t in self.timings) / self.wall_s


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile: with few samples the p99 is simply the slowest one."""
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_healthy(url: str, process: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"helios serve exited early:\n{log_path.read_text(errors='replace')}")
        try:
            if httpx2.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx2.TransportError:
            pass
        time.sleep(0.25)
    raise SystemExit(
        f"helios serve was not healthy in time:\n{log_path.read_text(errors='replace')}"
    )


@contextmanager
def own_server(
    max_num_seqs: int, max_model_len: int, extra_args: tuple[str, ...] = ()
) -> Iterator[str]:
    """`helios serve` on the default model, CPU, a free port; stopped when the block ends.

    `extra_args` are further `helios serve` flags (e.g. `--prompt-logprobs`)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="helios-bench-") as workdir:
        log_path = Path(workdir) / "server.log"
        environment = dict(os.environ, XDG_RUNTIME_DIR=workdir, TOKENIZERS_PARALLELISM="false")
        environment.pop("HELIOS_API_KEY", None)
        command = [
            sys.executable,
            "-m",
            "adapters.cli.main",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--device",
            "cpu",
            "--max-num-seqs",
            str(max_num_seqs),
            "--max-model-len",
            str(max_model_len),
            *extra_args,
        ]
        with server_process(command, url, log_path, environment):
            yield url


@contextmanager
def server_process(
    command: list[str], url: str, log_path: Path, environment: dict[str, str]
) -> Iterator[subprocess.Popen]:
    """Runs a server `command` from the repository root, its output in `log_path`, until `url`
    answers /health; stops it when the block ends."""
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, cwd=REPO_ROOT, env=environment, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        wait_until_healthy(url, process, log_path)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


def served_model(client: httpx2.Client, url: str) -> str:
    response = client.get(f"{url}/v1/models")
    response.raise_for_status()
    return response.json()["data"][0]["id"]


def stream_one(
    client: httpx2.Client,
    url: str,
    model: str,
    question: str,
    max_tokens: int,
    extra: dict | None = None,
) -> RequestTiming:
    """Streams one chat request; `extra` adds request fields (e.g. logprobs)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        **(extra or {}),
    }
    started = time.perf_counter()
    first_token_s = None
    completion_tokens = None
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            response.read()
            raise RuntimeError(f"HTTP {response.status_code}: {response.text}")
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                break
            frame = json.loads(data)
            if "error" in frame:
                raise RuntimeError(f"the stream carried an error: {frame['error']}")
            if frame.get("usage"):
                completion_tokens = frame["usage"]["completion_tokens"]
            # The first frame is the role announcement; the clock stops at the first content.
            has_content = any(c.get("delta", {}).get("content") for c in frame["choices"])
            if first_token_s is None and has_content:
                first_token_s = time.perf_counter() - started
    total_s = time.perf_counter() - started
    if completion_tokens != max_tokens:
        raise RuntimeError(f"expected {max_tokens} tokens, the server reported {completion_tokens}")
    return RequestTiming(
        first_token_s if first_token_s is not None else total_s, total_s, max_tokens
    )


def run_clients(clients: int, work: Callable[[int, httpx2.Client], None]) -> float:
    """Runs `work(client index, client)` on `clients` threads that start together; returns the
    wall seconds, or raises the first failure once every thread has finished."""
    start_together = threading.Barrier(clients + 1)
    failures: list[BaseException] = []
    lock = threading.Lock()

    def client_loop(client_index: int) -> None:
        with httpx2.Client(timeout=REQUEST_TIMEOUT_S) as client:
            start_together.wait(timeout=60)
            try:
                work(client_index, client)
            except Exception as error:
                # Kept, not raised: the caller hears of it once every thread has finished.
                with lock:
                    failures.append(error)

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    start_together.wait(timeout=60)
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    wall_s = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"{len(failures)} client(s) failed: {failures[0]}")
    return wall_s


def run_level(
    url: str,
    model: str,
    clients: int,
    requests_per_client: int,
    max_tokens: int,
    extra: dict | None = None,
) -> LevelResult:
    """`clients` threads start together; each streams its requests back to back."""
    timings: list[RequestTiming] = []
    lock = threading.Lock()

    def work(client_index: int, client: httpx2.Client) -> None:
        for request_index in range(requests_per_client):
            question = QUESTIONS[(client_index + request_index * clients) % len(QUESTIONS)]
            timing = stream_one(client, url, model, question, max_tokens, extra)
            with lock:
                timings.append(timing)

    try:
        wall_s = run_clients(clients, work)
    except RuntimeError as error:
        raise RuntimeError(f"at N={clients}: {error}") from error
    return LevelResult(clients, timings, wall_s)


def table(results: list[LevelResult], max_tokens: int) -> str:
    lines = [
        "| clients | requests | output tokens | wall s | requests/s | output tok/s "
        "| TTFT p50 ms | TTFT p99 ms | per-token p50 ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        first = [t.first_token_s * 1000 for t in result.timings]
        per_token = [
            (t.total_s - t.first_token_s) * 1000 / max(1, max_tokens - 1) for t in result.timings
        ]
        lines.append(
            f"| {result.clients} | {len(result.timings)} "
            f"| {sum(t.completion_tokens for t in result.timings)} | {result.wall_s:.1f} "
            f"| {result.requests_per_s:.2f} | {result.output_tokens_per_s:.1f} "
            f"| {percentile(first, 0.5):.0f} | {percentile(first, 0.99):.0f} "
            f"| {percentile(per_token, 0.5):.1f} |"
        )
    return "\n".join(lines)


def bench(url: str, levels: list[int], requests_per_client: int, max_tokens: int) -> None:
    with httpx2.Client(timeout=REQUEST_TIMEOUT_S) as client:
        model = served_model(client, url)
        # One request first: the first forward passes pay one-off allocation and warm-up costs.
        stream_one(client, url, model, QUESTIONS[0], max_tokens)
    results = []
    for clients in levels:
        result = run_level(url, model, clients, requests_per_client, max_tokens)
        print(
            f"N={clients}: {result.output_tokens_per_s:.1f} output tok/s in {result.wall_s:.1f} s",
            file=sys.stderr,
        )
        results.append(result)
    print(
        f"model {model}; {requests_per_client} request(s) per client, {max_tokens} tokens each, "
        f"greedy, EOS ignored; client on {platform.machine()} with {os.cpu_count()} CPUs\n"
    )
    print(table(results, max_tokens))
    base, top = results[0], results[-1]
    print(
        f"\naggregate output tokens/s at N={top.clients} vs N={base.clients}: "
        f"{top.output_tokens_per_s / base.output_tokens_per_s:.2f}x "
        f"({top.output_tokens_per_s:.1f} vs {base.output_tokens_per_s:.1f})"
    )


def add_client_arguments(
    parser: argparse.ArgumentParser, requests_per_client: int, clients: str
) -> None:
    """The client flags every server benchmark takes, with that benchmark's defaults."""
    parser.add_argument("--url", default=None, help="a running server (default: start one)")
    parser.add_argument("--requests-per-client", type=int, default=requests_per_client)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--clients", default=clients, help="comma-separated concurrency levels")


def run_bench(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    run: Callable[[str, list[int], int, int], None],
    max_model_len: int,
) -> int:
    """Runs `run(url, levels, requests_per_client, max_tokens)` against `--url`, or against a
    server this script starts for the largest concurrency level."""
    levels = [int(part) for part in args.clients.split(",")]
    if min(levels) < 1 or args.requests_per_client < 1 or args.max_tokens < 1:
        parser.error("clients, --requests-per-client and --max-tokens must be positive")
    if args.url:
        run(args.url.rstrip("/"), levels, args.requests_per_client, args.max_tokens)
        return 0
    with own_server(max(levels), max_model_len) as url:
        run(url, levels, args.requests_per_client, args.max_tokens)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_client_arguments(parser, requests_per_client=4, clients="1,4,16")
    parser.add_argument(
        "--max-model-len", type=int, default=2048, help="for the server this script starts"
    )
    args = parser.parse_args()
    return run_bench(parser, args, bench, args.max_model_len)


if __name__ == "__main__":
    sys.exit(main())
