"""The host-ceiling bench's server: `helios serve`'s HTTP stack, engine and gunicorn worker over
the simulated executor of `bench/simulated_executor.py` (the real SmolLM2 tokenizer, no model).

`bench/host.py` starts it; by hand: `.venv/bin/python bench/host_server.py --port 8000
--step-ms 7`. Besides the production routes it serves `GET /bench/executor`: the executor's
bookkeeping tally (steps, lanes, tokens, host seconds) as JSON, which the bench reads before and
after each measurement.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import falcon
import falcon.asgi
import torch
from gunicorn.app.base import BaseApplication

sys.path.insert(0, str(Path(__file__).resolve().parent))

from simulated_executor import TEXT, SimulatedExecutor  # noqa: E402

from adapters.cli.bootstrap import DEFAULT_MODEL_NAME  # noqa: E402
from adapters.cli.engine_thread import EngineLoop  # noqa: E402
from adapters.cli.serve_config import ServeConfig  # noqa: E402
from adapters.core.export import CoreSizes, resolve_core  # noqa: E402
from adapters.core.manifest import LoadedCore  # noqa: E402
from adapters.gpu.background_executor import BackgroundExecutor  # noqa: E402
from adapters.gpu.model.config import ModelConfig  # noqa: E402
from adapters.http.app import create_app  # noqa: E402
from adapters.http.serving import HttpSettings, ModelHolder, ServedModel  # noqa: E402
from adapters.metrics.prometheus import PrometheusMetrics  # noqa: E402
from adapters.tokenizer.hf import HfTokenizer  # noqa: E402
from domain.cache.blocks import blocks_needed  # noqa: E402
from domain.contract.geometry import ExecutorGeometry  # noqa: E402
from domain.contract.records import resolve_token_capacity  # noqa: E402
from domain.engine.engine import Engine, EngineConfig  # noqa: E402

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


def load_simulated_model(
    settings: HostSettings, metrics: PrometheusMetrics, executors: list[SimulatedExecutor]
) -> ServedModel:
    """What `adapters.cli.asgi.load_served_model` builds, with the simulated executor (kept in
    `executors` for the stats route) and no grammar compiler (constrained requests get a 400)."""
    core = resolve_core(None, CoreSizes(settings.max_num_seqs))
    tokenizer = HfTokenizer.from_dir(core.model_dir)
    if settings.torch_threads is not None:
        torch.set_num_threads(settings.torch_threads)
    executor = simulated_executor(settings, core, tokenizer)
    executors.append(executor)
    config = settings.engine
    runner = BackgroundExecutor(executor) if config.async_scheduling else executor
    engine = Engine(runner, tokenizer, config, observer=metrics)
    loop = EngineLoop(engine)
    loop.start()
    return ServedModel(
        name=DEFAULT_MODEL_NAME,
        tokenizer=tokenizer,
        engine=engine,
        allow_logprobs=engine.logprob_top_k > 0,
        parsers=ServeConfig().parsers,
        stop=loop.stop,
    )


class _ExecutorTally:
    """`GET /bench/executor`: the simulated executor's bookkeeping tally."""

    def __init__(self, executors: list[SimulatedExecutor]) -> None:
        self._executors = executors

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        if not self._executors:
            raise falcon.HTTPServiceUnavailable(description="the model is still loading")
        resp.media = self._executors[0].tally.snapshot()


def create_bench_app(settings: HostSettings) -> falcon.asgi.App:
    """The production app (`adapters.cli.asgi.create_app`) over the simulated model."""
    metrics = PrometheusMetrics(DEFAULT_MODEL_NAME)
    executors: list[SimulatedExecutor] = []
    holder = ModelHolder(loader=lambda: load_simulated_model(settings, metrics, executors))
    app = create_app(holder, HttpSettings(), metrics)
    app.add_route("/bench/executor", _ExecutorTally(executors))
    return app


class _Gunicorn(BaseApplication):
    """gunicorn as `helios serve` runs it (one asgi worker, the app built after the fork)."""

    def __init__(self, options: dict[str, object], settings: HostSettings) -> None:
        self._options = options
        self._settings = settings
        super().__init__()

    def load_config(self) -> None:
        for name, value in self._options.items():
            self.cfg.set(name, value)

    def load(self) -> falcon.asgi.App:
        return create_bench_app(self._settings)


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
    args = parser.parse_args()
    engine = EngineConfig(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        async_scheduling=args.async_scheduling,
    )
    settings = HostSettings(args.step_ms, args.max_model_len, args.torch_threads, engine)
    _Gunicorn(
        {
            "bind": f"{args.host}:{args.port}",
            "worker_class": "asgi",
            "workers": 1,
            "timeout": 300,
            "graceful_timeout": 10,
            "preload_app": False,
            "accesslog": "-",
            "control_socket_disable": True,
        },
        settings,
    ).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
