"""The host-ceiling bench's server: `helios serve`'s HTTP stack, engine and gunicorn worker over
the simulated executor of `bench/simulated_executor.py` (the real SmolLM2 tokenizer, no model).

`bench/host.py` starts it; by hand: `.venv/bin/python bench/host_server.py --port 8000
--step-ms 7`. Besides the production routes it serves `GET /bench/executor`: the executor's
bookkeeping tally (steps, lanes, tokens, host seconds) as JSON, which the bench reads before and
after each measurement.

With `--api-server-count N` (N > 1) it runs as `helios serve --api-server-count N` does: an
engine process (here this file with `--engine-process`: the simulated executor's engine behind
the production `EngineServer`) and N gunicorn workers, each the production API-process app
(`adapters.cli.asgi.create_app`, a `RemoteEngine` over the engine socket). The tally is then
served by the engine process on `--tally-port`.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import falcon
import falcon.asgi
import torch
from gunicorn.app.base import BaseApplication

sys.path.insert(0, str(Path(__file__).resolve().parent))

from simulated_executor import TEXT, SimulatedExecutor  # noqa: E402

from adapters.cli.asgi import METRICS_INTERVAL_S  # noqa: E402
from adapters.cli.asgi import create_app as create_api_process_app  # noqa: E402
from adapters.cli.bootstrap import DEFAULT_MODEL_NAME  # noqa: E402
from adapters.cli.engine_supervisor import AUTHKEY_VARIABLE, EngineProcess  # noqa: E402
from adapters.cli.engine_thread import EngineLoop  # noqa: E402
from adapters.cli.heap import freeze_start_up_heap  # noqa: E402
from adapters.cli.listening import gunicorn_listening  # noqa: E402
from adapters.cli.serve_config import ServeConfig  # noqa: E402
from adapters.core.export import CoreSizes, resolve_core  # noqa: E402
from adapters.core.manifest import LoadedCore  # noqa: E402
from adapters.engine_ipc.messages import Hello  # noqa: E402
from adapters.engine_ipc.server import EngineServer  # noqa: E402
from adapters.gpu.background_executor import BackgroundExecutor  # noqa: E402
from adapters.gpu.model.config import ModelConfig  # noqa: E402
from adapters.http.app import create_app  # noqa: E402
from adapters.http.serving import HttpSettings, ModelHolder, ServedModel  # noqa: E402
from adapters.metrics.prometheus import PrometheusMetrics  # noqa: E402
from adapters.metrics.registry import enable_multiprocess  # noqa: E402
from adapters.tokenizer.hf import HfTokenizer  # noqa: E402
from domain.cache.blocks import blocks_needed  # noqa: E402
from domain.contract.geometry import ExecutorGeometry  # noqa: E402
from domain.contract.records import resolve_token_capacity  # noqa: E402
from domain.engine.engine import Engine, EngineConfig  # noqa: E402
from domain.responses.store import ResponseStore  # noqa: E402

BLOCK_SIZE = 16


@dataclass(frozen=True)
class HostSettings:
    """What the bench's server runs: the simulated device step, the engine's limits and loop
    (`engine.async_scheduling`: the overlapped loop, the executor on a thread of its own)."""

    step_ms: float = 0.0
    max_model_len: int = 2048
    # torch's intra-op threads in the worker; None keeps torch's default, as `helios serve` does.
    torch_threads: int | None = None
    engine: EngineConfig = EngineConfig(max_num_seqs=64)

    @property
    def max_num_seqs(self) -> int:
        return self.engine.max_num_seqs or 64


def simulated_executor(
    settings: HostSettings, core: LoadedCore, tokenizer: HfTokenizer
) -> SimulatedExecutor:
    """The executor `helios serve` would build for `core`, simulated: its capacity, record size
    and logprob capability, with a KV pool no request waits for."""
    config = ModelConfig.from_dir(core.model_dir)
    geometry = ExecutorGeometry(
        capacity=core.capacity,
        block_size=BLOCK_SIZE,
        num_blocks=core.capacity * blocks_needed(settings.max_model_len, BLOCK_SIZE),
        vocab_size=min(tokenizer.vocab_size, config.vocab_size),
        max_model_len=settings.max_model_len,
        token_capacity=resolve_token_capacity(core.token_capacity),
        logprobs=core.capability,
    )
    text_ids = tokenizer.encode(TEXT, add_special_tokens=False)
    return SimulatedExecutor(geometry, text_ids, settings.step_ms / 1000)


def start_simulated_engine(
    settings: HostSettings, metrics: PrometheusMetrics, executors: list[SimulatedExecutor]
) -> tuple[Engine, HfTokenizer, LoadedCore, EngineLoop]:
    """The simulated executor (kept in `executors` for the tally) under the production engine,
    its loop started; `metrics` hears the engine's steps."""
    core = resolve_core(None, CoreSizes(settings.max_num_seqs))
    tokenizer = HfTokenizer.from_dir(core.model_dir)
    if settings.torch_threads is not None:
        torch.set_num_threads(settings.torch_threads)
    executor = simulated_executor(settings, core, tokenizer)
    executors.append(executor)
    config = settings.engine
    runner = BackgroundExecutor(executor) if config.async_scheduling else executor
    engine = Engine(runner, tokenizer, config, observer=metrics)
    loop = EngineLoop(engine, overlapped=config.async_scheduling)
    loop.start()
    return engine, tokenizer, core, loop


def load_simulated_model(
    settings: HostSettings, metrics: PrometheusMetrics, executors: list[SimulatedExecutor]
) -> ServedModel:
    """What `adapters.cli.asgi.load_served_model` builds, with the simulated executor and no
    grammar compiler (constrained requests get a 400)."""
    engine, tokenizer, _, loop = start_simulated_engine(settings, metrics, executors)
    freeze_start_up_heap()
    return ServedModel(
        name=DEFAULT_MODEL_NAME,
        tokenizer=tokenizer,
        engine=engine,
        allow_logprobs=engine.logprob_top_k > 0,
        parsers=ServeConfig().parsers,
        stop=loop.stop,
    )


def run_engine_process(settings: HostSettings, address: str, tally_port: int) -> None:
    """What `adapters.cli.engine_process` runs, over the simulated executor: the engine and a
    Responses store behind the engine socket, until SIGTERM; the tally on `tally_port`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda number, frame: stopping.set())
    executors: list[SimulatedExecutor] = []
    metrics = PrometheusMetrics(DEFAULT_MODEL_NAME, reports_engine=True)
    engine, _, core, loop = start_simulated_engine(settings, metrics, executors)
    hello = Hello.of_this_process(DEFAULT_MODEL_NAME, str(core.model_dir), engine)
    authkey = bytes.fromhex(os.environ[AUTHKEY_VARIABLE])
    server = EngineServer(engine, hello, ResponseStore(), address, authkey)
    server.start()
    freeze_start_up_heap()
    tally = _tally_server(tally_port, executors[0])
    threading.Thread(target=tally.serve_forever, name="bench-tally", daemon=True).start()
    stopping.wait()
    tally.shutdown()
    server.close()
    loop.stop()


def _tally(executor: SimulatedExecutor) -> dict[str, float]:
    """The executor's tally and the CPU seconds of the process that runs the engine."""
    return {**executor.tally.snapshot(), "process_cpu_s": time.process_time()}


def _tally_server(port: int, executor: SimulatedExecutor) -> ThreadingHTTPServer:
    """`GET /bench/executor` of the engine process: the tally as JSON."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = json.dumps(_tally(executor)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    return ThreadingHTTPServer(("127.0.0.1", port), Handler)


class _ExecutorTally:
    """`GET /bench/executor`: the simulated executor's bookkeeping tally."""

    def __init__(self, executors: list[SimulatedExecutor]) -> None:
        self._executors = executors

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        if not self._executors:
            raise falcon.HTTPServiceUnavailable(description="the model is still loading")
        resp.media = _tally(self._executors[0])


def create_bench_app(settings: HostSettings) -> falcon.asgi.App:
    """The production app (`adapters.cli.asgi.create_app`) over the simulated model."""
    metrics = PrometheusMetrics(DEFAULT_MODEL_NAME, reports_engine=True)
    executors: list[SimulatedExecutor] = []
    holder = ModelHolder(loader=lambda: load_simulated_model(settings, metrics, executors))
    app = create_app(holder, HttpSettings(), metrics)
    app.add_route("/bench/executor", _ExecutorTally(executors))
    return app


class _Gunicorn(BaseApplication):
    """gunicorn as `helios serve` runs it: asgi workers, each building its app with `load`
    after the fork."""

    def __init__(self, options: dict[str, object], load: Callable[[], falcon.asgi.App]) -> None:
        self._options = options
        self._load = load
        super().__init__()

    def load_config(self) -> None:
        for name, value in self._options.items():
            self.cfg.set(name, value)

    def load(self) -> falcon.asgi.App:
        return self._load()


def _gunicorn_options(host: str, port: int, workers: int) -> dict[str, object]:
    return {
        **gunicorn_listening(host, port, workers),
        "worker_class": "asgi",
        "workers": workers,
        "timeout": 300,
        "graceful_timeout": 10,
        "preload_app": False,
        "accesslog": "-",
        "control_socket_disable": True,
    }


def run_api_servers(args: argparse.Namespace) -> None:
    """`helios serve --api-server-count N`'s layout: this file as the engine process, N API
    processes under gunicorn, metrics in multiprocess files."""
    metrics_directory = tempfile.mkdtemp(prefix="helios-bench-metrics-")
    enable_multiprocess(metrics_directory)
    directory, address = EngineProcess.socket_address()
    os.environ[AUTHKEY_VARIABLE] = secrets.token_hex(32)
    command = [
        sys.executable,
        __file__,
        "--engine-process",
        address,
        *sys.argv[1:],
    ]
    engine = subprocess.Popen(command, env=dict(os.environ))
    config = ServeConfig(
        api_server_count=args.api_server_count,
        engine_address=address,
        async_scheduling=args.async_scheduling,
    )
    try:
        options = _gunicorn_options(args.host, args.port, args.api_server_count)
        _Gunicorn(options, lambda: create_api_process_app(config)).run()
    finally:
        engine.terminate()
        engine.wait(timeout=30)
        shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(metrics_directory, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--step-ms", type=float, default=0.0, help="simulated device step")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--torch-threads", type=int, default=None)
    parser.add_argument("--async-scheduling", action="store_true")
    parser.add_argument("--api-server-count", type=int, default=1)
    parser.add_argument(
        "--tally-port", type=int, default=None, help="with --api-server-count N > 1: the tally"
    )
    parser.add_argument("--engine-process", metavar="ADDRESS", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    engine = EngineConfig(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        async_scheduling=args.async_scheduling,
        metrics_interval_s=METRICS_INTERVAL_S,
    )
    settings = HostSettings(args.step_ms, args.max_model_len, args.torch_threads, engine)
    if args.engine_process is not None:
        run_engine_process(settings, args.engine_process, args.tally_port)
        return 0
    if args.api_server_count > 1:
        if args.tally_port is None:
            parser.error("--api-server-count above 1 needs --tally-port")
        run_api_servers(args)
        return 0
    _Gunicorn(_gunicorn_options(args.host, args.port, 1), lambda: create_bench_app(settings)).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
