"""Host ceiling: the serving stack over a simulated executor, at 1 to 64 streaming clients.

Run: `.venv/bin/python bench/host.py [--seconds S] [--clients 1,8,32,64] [--step-ms 0,7]
[--variants off,0,20] [--non-stream-variants off,20] [--endpoint chat|completions]
[--scheduling sync,async] [--rounds R]`.

For each `--step-ms` it starts `bench/host_server.py` (gunicorn, the production HTTP/SSE stack,
engine and emission, the real SmolLM2 tokenizer, `CompletionOutputs`; the simulated executor
does no model work and waits `step-ms` per step for the device). At each concurrency N it runs
N asyncio clients that send requests back to back (64 tokens each, EOS ignored) for each
logprobs variant: `off`, `0` (the chosen token's logprob only) and `20` (top 20 alternatives);
streamed, and unstreamed for `--non-stream-variants`. Each cell warms up, then measures a window
of `--seconds`: output tokens/s, engine steps/s against the ideal 1000/step-ms, inter-token
latency (gaps between content frames), server and client CPU seconds per 1k tokens, and the
executor's host bookkeeping per step (all steps, and steps of >= 56 lanes). Prints one table per
step and the ratios of the variants, which come from the same run; with `--scheduling
sync,async` each step runs a synchronous and an overlapped server (`helios serve
--async-scheduling`) and prints async over sync per cell. `--rounds R` runs every cell R times
(the variants' order rotating) and prints each cell's median and the median of the rounds'
paired ratios with their range: on a shared 2-core box one pair of cells can read 0.76x and
the next 0.93x.

`--micro` instead times the executor's bookkeeping in this process (no HTTP, no engine): one
step of `--micro-lanes` decode lanes, submit and read, per variant. `--profile N:VARIANT` records
the server worker with py-spy (when installed) during that cell and prints its top costs.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import msgspec
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prompts import QUESTIONS  # noqa: E402
from serve import free_port, percentile, server_process  # noqa: E402

from adapters.http.process_header import HEADER as API_SERVER_HEADER  # noqa: E402

SERVER = Path(__file__).resolve().parent / "host_server.py"
# The logprobs a variant asks for: None (off), or K alternatives (0: the chosen token only).
VARIANTS: dict[str, int | None] = {"off": None, "0": 0, "20": 20}


@dataclass(frozen=True)
class Cell:
    """One measurement: N clients, one logprobs variant, streamed or not."""

    clients: int
    variant: str
    stream: bool
    round: int = 0

    @property
    def mode(self) -> str:
        return "stream" if self.stream else "non-stream"


@dataclass(frozen=True)
class Snapshot:
    """Counters read at one instant: server, client and whole-machine busy CPU seconds, the
    executor's tally."""

    at: float
    server_cpu_s: float
    client_cpu_s: float
    machine_cpu_s: float
    executor: dict


@dataclass
class Arrivals:
    """What the clients saw: (time, tokens) per content frame or response, (time, gap) between
    consecutive content frames of one stream, and how many requests completed."""

    tokens: list[tuple[float, int]] = field(default_factory=list)
    gaps: list[tuple[float, float]] = field(default_factory=list)
    requests: int = 0
    resent: int = 0
    # Requests answered by each API process (its `x-helios-api-server` header): with several,
    # how a cell's connections split among them moves its throughput.
    servers: collections.Counter[str] = field(default_factory=collections.Counter)


@dataclass(frozen=True)
class CellResult:
    """One cell's window: its length, what the engine and the clients counted in it, CPU."""

    cell: Cell
    seconds: float
    tokens: int  # committed by the engine in the window
    delivered: int  # counted by the clients in the window (coalesced frames: at their end)
    gaps_ms: list[float]
    steps: int
    lanes: int
    server_cpu_s: float
    client_cpu_s: float
    executor_host_s: float  # the executor's CPU in submit and read
    wide_steps: int  # steps of >= 56 sampling lanes, and their executor CPU
    wide_host_s: float
    requests: int
    resent: int
    others_cores: float  # CPU the rest of the machine used meanwhile, in cores
    engine_cores: float  # CPU of the process that runs the engine (the worker, or the engine
    # process under --api-server-count), in cores
    split: tuple[int, ...] = ()  # requests each API process answered, most first

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds


class HostServer:
    """A running `bench/host_server.py`: its URL and its processes' CPU time."""

    def __init__(self, url: str, process: subprocess.Popen, tally_url: str | None = None) -> None:
        self.url = url
        self.tally_url = tally_url or f"{url}/bench/executor"
        self._master = psutil.Process(process.pid)

    @property
    def worker_pid(self) -> int:
        """The process to profile: the engine process where there is one, else the worker."""
        children = self._master.children()
        engines = [child for child in children if "--engine-process" in child.cmdline()]
        return (engines or children)[0].pid

    def cpu_seconds(self) -> float:
        processes = [self._master, *self._master.children(recursive=True)]
        return sum(p.cpu_times().user + p.cpu_times().system for p in processes)

    async def snapshot(self, session: aiohttp.ClientSession) -> Snapshot:
        at = time.perf_counter()
        server_cpu_s, client_cpu_s = self.cpu_seconds(), time.process_time()
        machine = psutil.cpu_times()
        busy_s = machine.user + machine.nice + machine.system + machine.irq + machine.softirq
        async with session.get(self.tally_url) as response:
            executor = await response.json()
        return Snapshot(at, server_cpu_s, client_cpu_s, busy_s, executor)


@contextmanager
def host_server(
    step_ms: float,
    max_num_seqs: int,
    torch_threads: int | None = None,
    overlapped: bool = False,
    api_servers: int = 1,
) -> Iterator[HostServer]:
    """`bench/host_server.py` on a free port, stopped when the block ends; with `api_servers`
    above 1, an engine process and that many API processes (its tally on a port of its own)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    tally_port = free_port() if api_servers > 1 else None
    with tempfile.TemporaryDirectory(prefix="helios-host-bench-") as workdir:
        log_path = Path(workdir) / "server.log"
        environment = dict(os.environ, TOKENIZERS_PARALLELISM="false")
        command = [
            sys.executable,
            str(SERVER),
            "--port",
            str(port),
            "--step-ms",
            str(step_ms),
            "--max-num-seqs",
            str(max_num_seqs),
            *(["--torch-threads", str(torch_threads)] if torch_threads else []),
            *(["--async-scheduling"] if overlapped else []),
            *(["--api-server-count", str(api_servers)] if api_servers > 1 else []),
            *(["--tally-port", str(tally_port)] if tally_port else []),
        ]
        tally_url = f"http://127.0.0.1:{tally_port}/bench/executor" if tally_port else None
        try:
            with server_process(command, url, log_path, environment) as process:
                yield HostServer(url, process, tally_url)
        except BaseException:
            tail = log_path.read_text(errors="replace").splitlines()[-40:]
            print("the server's log ends:", *tail, sep="\n", file=sys.stderr)
            raise


def request(endpoint: str, index: int, max_tokens: int, variant: str, stream: bool) -> dict:
    """The body of one request: greedy, EOS ignored, exactly `max_tokens` tokens."""
    question = QUESTIONS[index % len(QUESTIONS)]
    body: dict = {"max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    top = VARIANTS[variant]
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": question}]
        if top is not None:
            body |= {"logprobs": True, "top_logprobs": top}
    else:
        body["prompt"] = question
        if top is not None:
            body["logprobs"] = top
    return body


class _Skipped(msgspec.Struct):
    """A JSON value the bench only counts: msgspec skips its fields without building them."""


class _Logprobs(msgspec.Struct):
    content: list[_Skipped] | None = None  # chat
    tokens: list[msgspec.Raw] | None = None  # completions


class _Delta(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    delta: _Delta | None = None
    text: str | None = None
    logprobs: _Logprobs | None = None


class _Usage(msgspec.Struct):
    completion_tokens: int


class _Frame(msgspec.Struct):
    """What the bench reads of a frame or a whole response; the rest is skipped unbuilt (a
    K=20 chat frame is 1.7 KB of JSON, and the clients share the box with the server)."""

    choices: list[_Choice] = []
    usage: _Usage | None = None
    error: dict | None = None


_decode_frame = msgspec.json.Decoder(_Frame).decode


def frame_tokens(frame: _Frame, endpoint: str) -> int:
    """Tokens one streamed frame carries: its logprob entries, else one per content delta."""
    if not frame.choices:
        return 0
    choice = frame.choices[0]
    logprobs = choice.logprobs
    if endpoint == "chat":
        if logprobs is not None and logprobs.content is not None:
            return len(logprobs.content)
        return 1 if choice.delta is not None and choice.delta.content else 0
    if logprobs is not None and logprobs.tokens is not None:
        return len(logprobs.tokens)
    return 1 if choice.text else 0


async def posted(
    session: aiohttp.ClientSession, url: str, body: dict, seen: Arrivals
) -> aiohttp.ClientResponse:
    """The response to `body`, its headers read. A kept-alive connection that the server closed
    as the request went out fails before any response: that request is sent once more
    (counted in `seen.resent`; a server that is gone fails again)."""
    try:
        return await session.post(url, json=body)
    except aiohttp.ServerDisconnectedError:
        seen.resent += 1
        return await session.post(url, json=body)


async def aiohttp_events(
    session: aiohttp.ClientSession, url: str, body: dict, seen: Arrivals
) -> AsyncIterator[bytes]:
    """The `data:` payloads of one streamed response, read by aiohttp."""
    async with await posted(session, url, body, seen) as response:
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {await response.text()}")
        seen.servers[response.headers.get(API_SERVER_HEADER, "")] += 1
        async for line in response.content:
            if line.startswith(b"data:"):
                yield line[5:].strip()


async def aiohttp_body(
    session: aiohttp.ClientSession, url: str, body: dict, seen: Arrivals
) -> bytes:
    """The whole body of one response, read by aiohttp."""
    async with await posted(session, url, body, seen) as response:
        raw = await response.read()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {raw[:500]!r}")
    return raw


def _split_text(split: tuple[int, ...], processes: int) -> str:
    """', requests by API process 40/24' (each process's count, most first) when several serve."""
    if processes < 2:
        return ""
    counts = (*split, *([0] * (processes - len(split))))
    return f", requests by API process {'/'.join(map(str, counts))}"


async def stream_one(
    events: AsyncIterator[bytes], body: dict, endpoint: str, seen: Arrivals
) -> None:
    """Counts one streamed response's tokens as its frames arrive and checks its usage."""
    last = None
    counted = 0
    usage = None
    async for data in events:
        # Read on to the body's end, so that a kept-alive connection is ready for the next.
        if data == b"[DONE]":
            continue
        now = time.perf_counter()
        frame = _decode_frame(data)
        if frame.error is not None:
            raise RuntimeError(f"the stream carried an error: {frame.error}")
        if frame.usage is not None:
            usage = frame.usage.completion_tokens
        tokens = frame_tokens(frame, endpoint)
        if tokens:
            if last is not None:
                seen.gaps.append((now, now - last))
            seen.tokens.append((now, tokens))
            last, counted = now, counted + tokens
    if usage != body["max_tokens"]:
        raise RuntimeError(f"expected {body['max_tokens']} tokens, the usage said {usage}")
    if counted < usage:
        # Frames without logprobs entries do not say how many tokens a merged delta holds.
        seen.tokens.append((time.perf_counter(), usage - counted))
    seen.requests += 1


def complete_one(raw: bytes, body: dict, seen: Arrivals) -> None:
    """Counts one whole response's tokens and checks them against the request."""
    usage = _decode_frame(raw).usage
    tokens = usage.completion_tokens if usage is not None else None
    if tokens != body["max_tokens"]:
        raise RuntimeError(f"expected {body['max_tokens']} tokens, the usage said {tokens}")
    seen.tokens.append((time.perf_counter(), tokens))
    seen.requests += 1


async def run_cell(
    server: HostServer,
    cell: Cell,
    args: argparse.Namespace,
    profile: Path | None = None,
) -> CellResult:
    """Clients send requests back to back until the window ends; in-flight requests finish
    (uncounted) before the next cell."""
    path = "/v1/chat/completions" if args.endpoint == "chat" else "/v1/completions"
    url = server.url + path
    seen = Arrivals()
    started = time.perf_counter()
    window_end = started + args.warmup + args.seconds

    async def client(index: int) -> None:
        sent = 0
        while time.perf_counter() < window_end:
            body = request(
                args.endpoint,
                index + sent * cell.clients,
                args.max_tokens,
                cell.variant,
                cell.stream,
            )
            if cell.stream:
                events = aiohttp_events(session, url, body, seen)
                await stream_one(events, body, args.endpoint, seen)
            else:
                complete_one(await aiohttp_body(session, url, body, seen), body, seen)
            sent += 1

    async def snapshot_at(moment: float) -> Snapshot:
        await asyncio.sleep(max(0.0, moment - time.perf_counter()))
        return await server.snapshot(session)

    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        clients = [asyncio.create_task(client(i)) for i in range(cell.clients)]
        before = await snapshot_at(started + args.warmup)
        recorder = start_profile(server, args.seconds, profile) if profile else None
        after = await snapshot_at(window_end)
        await asyncio.gather(*clients)
    if recorder is not None:
        recorder.wait(timeout=120)
    return measured(cell, seen, before, after)


def measured(cell: Cell, seen: Arrivals, before: Snapshot, after: Snapshot) -> CellResult:
    def inside(moment: float) -> bool:
        return before.at <= moment < after.at

    old, new = before.executor, after.executor
    return CellResult(
        cell,
        after.at - before.at,
        new["tokens"] - old["tokens"],
        sum(tokens for moment, tokens in seen.tokens if inside(moment)),
        [gap * 1000 for moment, gap in seen.gaps if inside(moment)],
        new["steps"] - old["steps"],
        new["lanes"] - old["lanes"],
        after.server_cpu_s - before.server_cpu_s,
        after.client_cpu_s - before.client_cpu_s,
        new["submit_s"] + new["read_s"] - old["submit_s"] - old["read_s"],
        new["wide_steps"] - old["wide_steps"],
        new["wide_s"] - old["wide_s"],
        seen.requests,
        seen.resent,
        (
            after.machine_cpu_s
            - before.machine_cpu_s
            - (after.server_cpu_s - before.server_cpu_s)
            - (after.client_cpu_s - before.client_cpu_s)
        )
        / (after.at - before.at),
        (new["process_cpu_s"] - old["process_cpu_s"]) / (after.at - before.at),
        tuple(sorted((n for name, n in seen.servers.items() if name), reverse=True)),
    )


def start_profile(server: HostServer, seconds: float, output: Path) -> subprocess.Popen | None:
    """py-spy records the worker for the window, if present: only the thread holding the GIL,
    since the worker's Python threads share it and its time is the host's budget."""
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is None:
        print("--profile: py-spy is not installed; no profile", file=sys.stderr)
        return None
    command = [
        spy,
        "record",
        "--pid",
        str(server.worker_pid),
        "--duration",
        str(int(seconds)),
        "--rate",
        "250",
        "--nonblocking",
        "--gil",
        "--threads",
        "--format",
        "raw",
        "--output",
        str(output),
    ]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def profile_summary(collapsed: Path, top: int = 25) -> str:
    """The costliest functions of a py-spy raw (collapsed) profile: share of samples spent in
    each (inclusive) and in its own code (self), and each thread's share."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    own_lines: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        threads[frames[0]] += count
        names = [_function(frame) for frame in frames[1:]]
        for name in set(names):
            inclusive[name] += count
        if names:
            own[names[-1]] += count
            own_lines[_line(frames[-1])] += count
    if not total:
        return "the profile holds no samples"
    lines = [
        f"{total} samples of the thread holding the GIL",
        "",
        "| thread | share |",
        "|---|---|",
    ]
    lines += [f"| {name} | {100 * n / total:.1f}% |" for name, n in threads.most_common()]
    lines += ["", "| function | inclusive | self |", "|---|---|---|"]
    for name, n in inclusive.most_common(top):
        lines.append(f"| `{name}` | {100 * n / total:.1f}% | {100 * own[name] / total:.1f}% |")
    lines += ["", "| function (by self time) | self |", "|---|---|"]
    lines += [f"| `{name}` | {100 * n / total:.1f}% |" for name, n in own.most_common(top)]
    lines += ["", "| line (by self time) | self |", "|---|---|"]
    lines += [f"| `{at}` | {100 * n / total:.1f}% |" for at, n in own_lines.most_common(top)]
    return "\n".join(lines)


def _function(frame: str) -> str:
    """`name (path/to/module.py:line)` as `name (module.py)`: lines merged per function."""
    name, _, where = frame.partition(" (")
    module = where.rsplit(":", 1)[0].rsplit("/", 2)
    return f"{name} ({'/'.join(module[-2:])})"


def _line(frame: str) -> str:
    """`name (path/to/module.py:line)` as `name (to/module.py:line)`."""
    name, _, where = frame.partition(" (")
    return f"{name} ({'/'.join(where.rstrip(')').rsplit('/', 2)[-2:])})"


def _ms(values: list[float], fraction: float | None = None) -> str:
    if not values:
        return "-"
    return f"{statistics.fmean(values) if fraction is None else percentile(values, fraction):.2f}"


def table(results: list[CellResult], step_ms: float) -> str:
    ideal = f"{1000 / step_ms:.0f}" if step_ms else "-"
    lines = [
        "| round | mode | clients | logprobs | tok/s | client tok/s | steps/s | ideal steps/s "
        "| lanes/step | ITL mean ms | ITL p50 ms | ITL p99 ms | server CPU s/1k tok "
        "| client CPU s/1k tok | executor CPU ms/step | same, steps >= 56 lanes "
        "| engine's process CPU ms/step | other processes' CPU (cores) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        per_k = 1000 / r.tokens if r.tokens else float("nan")
        wide = f"{1000 * r.wide_host_s / r.wide_steps:.2f}" if r.wide_steps else "-"
        lines.append(
            f"| {r.cell.round + 1} | {r.cell.mode} | {r.cell.clients} | {r.cell.variant} "
            f"| {r.tokens_per_s:,.0f} "
            f"| {r.delivered / r.seconds:,.0f} | {r.steps_per_s:.0f} | {ideal} "
            f"| {r.lanes / max(r.steps, 1):.1f} "
            f"| {_ms(r.gaps_ms)} | {_ms(r.gaps_ms, 0.5)} | {_ms(r.gaps_ms, 0.99)} "
            f"| {r.server_cpu_s * per_k:.3f} | {r.client_cpu_s * per_k:.3f} "
            f"| {1000 * r.executor_host_s / max(r.steps, 1):.2f} | {wide} "
            f"| {1000 * r.engine_cores / max(r.steps_per_s, 1e-9):.2f} | {r.others_cores:.2f} |"
        )
    return "\n".join(lines)


def ratios(results: list[CellResult]) -> str:
    """tok/s of one variant over another at each concurrency and mode, where both ran: with
    several rounds, the median of the rounds' paired ratios and their range."""
    rate = {
        (r.cell.mode, r.cell.clients, r.cell.variant, r.cell.round): r.tokens_per_s for r in results
    }
    rounds = sorted({r.cell.round for r in results})
    pairs = [("20", "0"), ("0", "off"), ("20", "off")]
    lines = [
        "| mode | clients | "
        + " | ".join(f"K={a} / {'off' if b == 'off' else 'K=' + b}" for a, b in pairs)
        + " |",
        "|---|---|" + "---|" * len(pairs),
    ]
    for mode, clients in dict.fromkeys((m, n) for m, n, _, _ in rate):
        cells = []
        for a, b in pairs:
            paired = [
                top / bottom
                for n in rounds
                if (top := rate.get((mode, clients, a, n)))
                and (bottom := rate.get((mode, clients, b, n)))
            ]
            cells.append(_ratio_text(paired))
        lines.append(f"| {mode} | {clients} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def medians(results: list[CellResult], step_ms: float) -> str:
    """Each cell's median over the rounds: tok/s and steps/s (against the ideal)."""
    by_cell: dict[tuple[str, int, str], list[CellResult]] = {}
    for r in results:
        by_cell.setdefault((r.cell.mode, r.cell.clients, r.cell.variant), []).append(r)
    lines = [
        "| mode | clients | logprobs | rounds | tok/s, median (range) | steps/s, median (range) |",
        "|---|---|---|---|---|---|",
    ]
    for (mode, clients, variant), runs in by_cell.items():
        tokens = [r.tokens_per_s for r in runs]
        steps = [r.steps_per_s for r in runs]
        share = statistics.median(steps) * step_ms / 10
        ideal = f", {share:.0f}% of ideal" if step_ms else ""
        lines.append(
            f"| {mode} | {clients} | {variant} | {len(runs)} "
            f"| {statistics.median(tokens):,.0f} ({min(tokens):,.0f}-{max(tokens):,.0f}) "
            f"| {statistics.median(steps):.0f} ({min(steps):.0f}-{max(steps):.0f}){ideal} |"
        )
    return "\n".join(lines)


def _ratio_text(paired: list[float]) -> str:
    """One ratio as `0.93x`; several as their median and range, `0.93x (0.88-0.97, 5)`."""
    if not paired:
        return "-"
    if len(paired) == 1:
        return f"{paired[0]:.2f}x"
    middle = statistics.median(paired)
    return f"{middle:.2f}x ({min(paired):.2f}-{max(paired):.2f}, {len(paired)})"


def cells(args: argparse.Namespace) -> list[Cell]:
    """Every cell, round by round and level by level; the variants' order rotates per level
    and per round so that none always runs first."""
    planned = []
    for round_ in range(args.rounds):
        for index, clients in enumerate(args.clients):
            for stream, variants in ((True, args.variants), (False, args.non_stream_variants)):
                shift = (index + round_) % len(variants) if variants else 0
                for variant in variants[shift:] + variants[:shift]:
                    planned.append(Cell(clients, variant, stream, round_))
    return planned


async def bench_step(
    server: HostServer, step_ms: float, args: argparse.Namespace, scheduling: str
) -> list[CellResult]:
    async with aiohttp.ClientSession() as session:
        warm = request(args.endpoint, 0, args.max_tokens, "20", True)
        path = "/v1/chat/completions" if args.endpoint == "chat" else "/v1/completions"
        seen = Arrivals()
        await stream_one(
            aiohttp_events(session, server.url + path, warm, seen), warm, args.endpoint, seen
        )
    results = []
    for cell in cells(args):
        profile = None
        if args.profile == (cell.clients, cell.variant) and cell.stream and not cell.round:
            profile = Path(tempfile.mkdtemp(prefix="helios-host-profile-")) / "profile.txt"
        result = await run_cell(server, cell, args, profile)
        print(
            f"step {step_ms} ms, {scheduling}, round {cell.round + 1}, {cell.mode}, "
            f"N={cell.clients}, "
            f"logprobs {cell.variant}: "
            f"{result.tokens_per_s:,.0f} tok/s ({result.delivered / result.seconds:,.0f} "
            f"delivered), {result.steps_per_s:.0f} steps/s, {result.requests} requests"
            f"{f', {result.resent} resent' if result.resent else ''}"
            f"{_split_text(result.split, args.api_server_count)}; cores: the engine's "
            f"process {result.engine_cores:.2f}, "
            f"server {result.server_cpu_s / result.seconds:.2f}, "
            f"other processes {result.others_cores:.2f}",
            file=sys.stderr,
        )
        results.append(result)
        if profile is not None and profile.exists():
            print(f"\npy-spy profile of the server worker, {cell}:\n")
            print(profile_summary(profile))
            print(f"\n(collapsed stacks: {profile})\n")
    print(f"\n### simulated device step {step_ms:g} ms, {scheduling} scheduling\n")
    print(table(results, step_ms))
    if args.rounds > 1:
        print()
        print(medians(results, step_ms))
    print()
    print(ratios(results))
    return results


def scheduling_ratios(by_mode: dict[str, list[CellResult]]) -> str:
    """tok/s and steps/s of async scheduling over sync in each cell both ran."""
    rates = {
        mode: {(r.cell.mode, r.cell.clients, r.cell.variant, r.cell.round): r for r in results}
        for mode, results in by_mode.items()
    }
    lines = [
        "| mode | clients | logprobs | round | tok/s async / sync | steps/s async / sync |",
        "|---|---|---|---|---|---|",
    ]
    for key, synchronous in rates.get("sync", {}).items():
        overlapped = rates.get("async", {}).get(key)
        if overlapped and synchronous.tokens_per_s and synchronous.steps_per_s:
            tokens = overlapped.tokens_per_s / synchronous.tokens_per_s
            steps = overlapped.steps_per_s / synchronous.steps_per_s
            lines.append(
                f"| {key[0]} | {key[1]} | {key[2]} | {key[3] + 1} | {tokens:.2f}x | {steps:.2f}x |"
            )
    return "\n".join(lines)


def micro(args: argparse.Namespace) -> None:
    """The executor's bookkeeping per step in this process: submit and read of one step of
    `--micro-lanes` decode lanes, over `--micro-steps` steps after 20 warm-up steps, per
    variant: this thread's CPU time (what the step costs the host) and the wall time (which a
    busy machine stretches)."""
    import torch
    from host_server import HostSettings, simulated_executor

    from adapters.core.export import CoreSizes, resolve_core
    from adapters.tokenizer.hf import HfTokenizer
    from domain.engine.engine import EngineConfig
    from domain.engine.step import SlotWork, StepPlan
    from domain.logprobs.values import LogprobOptions
    from domain.requests.choice_sampling import LaneSampling
    from domain.requests.sampling import SamplingParams

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    lanes = args.micro_lanes
    core = resolve_core(None, CoreSizes(max(lanes, 64)))
    tokenizer = HfTokenizer.from_dir(core.model_dir)
    settings = HostSettings(engine=EngineConfig(max_num_seqs=max(lanes, 64)))
    executor = simulated_executor(settings, core, tokenizer)
    params = SamplingParams(max_tokens=None, temperature=0.0)
    tally = executor.tally
    print(
        f"executor bookkeeping, {lanes} decode lanes a step, {args.micro_steps} steps after "
        "20 warm-up steps, in-process\n"
    )
    print(
        "| logprobs | submit CPU ms | read CPU ms | CPU ms/step | CPU us/lane "
        "| wall ms/step (median) |"
    )
    print("|---|---|---|---|---|---|")
    for variant in args.variants:
        top = VARIANTS[variant]
        options = None if top is None else LogprobOptions(top_k=top)
        sampling = LaneSampling(params, seed=0, remaining=1 << 20, logprobs=options)
        walls = []
        for step in range(20 + args.micro_steps):
            if step == 20:
                submit_s, read_s = tally.submit_s, tally.read_s
            plan = StepPlan(
                tuple(
                    SlotWork(slot, 0, (7,), 100 + step, (slot,), 10, True, sampling)
                    for slot in range(lanes)
                )
            )
            entered = time.perf_counter()
            executor.read(executor.submit(plan))
            walls.append(time.perf_counter() - entered)
        submit_ms = 1000 * (tally.submit_s - submit_s) / args.micro_steps
        read_ms = 1000 * (tally.read_s - read_s) / args.micro_steps
        step_ms = submit_ms + read_ms
        print(
            f"| {variant} | {submit_ms:.2f} | {read_ms:.2f} | {step_ms:.2f} "
            f"| {1000 * step_ms / lanes:.0f} | {1000 * statistics.median(walls[20:]):.2f} |"
        )


def _levels(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def _variants(text: str) -> list[str]:
    chosen = [part for part in text.split(",") if part]
    unknown = [part for part in chosen if part not in VARIANTS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown variants {unknown}; pick from {list(VARIANTS)}")
    return chosen


def _profile(text: str) -> tuple[int, str]:
    clients, _, variant = text.partition(":")
    return int(clients), _variants(variant)[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="measured window per cell")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds before each window")
    parser.add_argument("--clients", type=_levels, default=[1, 8, 32, 64])
    parser.add_argument(
        "--step-ms",
        type=lambda t: [float(p) for p in t.split(",")],
        default=[0.0],
        help="simulated device step(s), one server each",
    )
    parser.add_argument("--variants", type=_variants, default=["off", "0", "20"])
    parser.add_argument("--non-stream-variants", type=_variants, default=["off", "20"])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every cell this many times, variants rotating; ratios are the rounds' median",
    )
    parser.add_argument("--endpoint", choices=("chat", "completions"), default="chat")
    parser.add_argument(
        "--profile",
        type=_profile,
        default=None,
        help="N:VARIANT, e.g. 64:20: py-spy the worker during that streamed cell",
    )
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        help="torch intra-op threads in the server (and --micro); default: torch's own",
    )
    parser.add_argument(
        "--scheduling",
        type=lambda t: [p for p in t.split(",") if p in ("sync", "async")] or ["sync"],
        default=["sync"],
        help="sync, async or sync,async: one server each, `--async-scheduling` for async",
    )
    parser.add_argument(
        "--api-server-count",
        type=int,
        default=1,
        help="API processes over one engine process, as `helios serve --api-server-count N`",
    )
    parser.add_argument("--micro", action="store_true", help="time the executor in-process")
    parser.add_argument("--micro-lanes", type=int, default=60)
    parser.add_argument("--micro-steps", type=int, default=200)
    args = parser.parse_args()
    if args.micro:
        micro(args)
        return 0
    print(
        f"bench/host.py: {args.endpoint} endpoint, {args.max_tokens} tokens a request, "
        f"{args.seconds:g} s window after {args.warmup:g} s warm-up per cell; torch threads "
        f"in the server: {args.torch_threads or 'default'}; API processes: "
        f"{args.api_server_count}; "
        f"{platform.machine()}, {os.cpu_count()} CPUs, load average "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} at start"
    )
    for step_ms in args.step_ms:
        by_mode = {}
        for scheduling in args.scheduling:
            overlapped = scheduling == "async"
            with host_server(
                step_ms, max(args.clients), args.torch_threads, overlapped, args.api_server_count
            ) as server:
                by_mode[scheduling] = asyncio.run(bench_step(server, step_ms, args, scheduling))
        if len(by_mode) > 1:
            print(f"\n### step {step_ms:g} ms: async scheduling over sync, same run\n")
            print(scheduling_ratios(by_mode))
    return 0


if __name__ == "__main__":
    sys.exit(main())
