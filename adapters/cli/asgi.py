"""Composition root of a gunicorn worker: `adapters.cli.asgi:create_app()`.

The worker builds the app at import of this factory, and the model loads on ASGI startup, after
gunicorn has forked, so no model or device state ever crosses a fork.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import falcon.asgi

from adapters.cli import bootstrap
from adapters.cli.engine_supervisor import AUTHKEY_VARIABLE
from adapters.cli.engine_thread import EngineLoop
from adapters.cli.heap import freeze_start_up_heap
from adapters.cli.priority import yield_cpu_to_engine
from adapters.cli.serve_config import ServeConfig
from adapters.engine_ipc.client import EngineLink, RemoteEngine, RemoteResponseStore
from adapters.http.app import create_app as create_http_app
from adapters.http.serving import HttpSettings, ModelHolder, ServedModel
from adapters.metrics.prometheus import PrometheusMetrics
from adapters.tokenizer.hf import HfTokenizer
from domain.engine.engine import EngineConfig
from ports.metrics import EngineObserver

_log = logging.getLogger(__name__)
# After a tensor-parallel world breaks, the worker keeps answering (failed requests, an
# unhealthy /health) this long, then exits with this status so that gunicorn starts a fresh
# worker and world. 3 and 4 would make gunicorn halt instead.
FAILURE_GRACE_S = 2.0
FAILURE_EXIT_STATUS = 70


def exit_after_failure(message: str) -> None:
    """Exits this process a moment after the model broke (gunicorn or `helios serve` then
    starts afresh)."""
    _log.critical("the model can no longer run (%s); exiting in %.0f s", message, FAILURE_GRACE_S)
    timer = threading.Timer(FAILURE_GRACE_S, os._exit, (FAILURE_EXIT_STATUS,))
    timer.daemon = True
    timer.start()


@dataclass(frozen=True)
class RunningEngine:
    """A loaded model with its engine thread started; `stop` ends both."""

    loaded: bootstrap.LoadedModel
    stop: Callable[[], None]


# How often a busy engine reports its steps to the metrics (and always as it goes idle): a
# scrape sees them within this long, and the engine thread saves the observer's per-step work.
METRICS_INTERVAL_S = 0.025


def start_engine(config: ServeConfig, observer: EngineObserver | None = None) -> RunningEngine:
    """Loads the model and starts the engine thread; `observer` hears the engine's steps."""
    loaded = bootstrap.load(
        config.model,
        config.runner,
        EngineConfig(
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_logprobs=config.max_logprobs,
            speculative=config.speculative,
            async_scheduling=config.async_scheduling,
            prefix_caching=config.prefix_caching,
            metrics_interval_s=METRICS_INTERVAL_S,
        ),
        config.served_model_name,
        observer,
        parallel=config.parallel,
        on_failure=exit_after_failure,
    )
    loop = EngineLoop(loaded.engine, overlapped=config.async_scheduling)
    loop.start()

    def stop() -> None:
        loop.stop()
        loaded.close()

    return RunningEngine(loaded, stop)


def load_served_model(config: ServeConfig, observer: EngineObserver | None = None) -> ServedModel:
    """Loads the model, starts the engine thread and describes what is served."""
    running = start_engine(config, observer)
    loaded = running.loaded
    return ServedModel(
        name=loaded.name,
        tokenizer=loaded.tokenizer,
        engine=loaded.engine,
        allow_logprobs=loaded.engine.logprob_top_k > 0,
        parsers=config.parsers,
        stop=running.stop,
        failure=loaded.failure,
    )


def connect_served_model(config: ServeConfig) -> ServedModel:
    """An API process's model: the engine process's engine and response store over a link,
    with a tokenizer of its own for the HTTP work (templates, detokenizing, rendering)."""
    if config.engine_address is None:
        raise ValueError("an API process needs the engine process's address")
    authkey = bytes.fromhex(os.environ[AUTHKEY_VARIABLE])
    link = EngineLink.connect(config.engine_address, authkey, config.engine_wait_s)
    hello = link.hello
    engine = RemoteEngine(link)
    return ServedModel(
        name=hello.name,
        tokenizer=HfTokenizer.from_dir(Path(hello.model_dir)),
        engine=engine,
        allow_logprobs=hello.allow_logprobs,
        parsers=config.parsers,
        stop=link.close,
        failure=engine.failure,
        responses=RemoteResponseStore(link),
    )


def create_app(config: ServeConfig | None = None) -> falcon.asgi.App:
    config = config or ServeConfig.from_environment()
    # One metrics object per app: the engine reports steps to it, the app counts errors in it.
    reports_engine = config.api_server_count <= 1
    if not reports_engine:
        # On the worker's main thread, before it starts any other (they inherit the priority).
        yield_cpu_to_engine(config.api_server_nice)
    metrics = PrometheusMetrics(
        bootstrap.served_name(config.model, config.served_model_name),
        reports_engine=reports_engine,
    )

    def load() -> ServedModel:
        if reports_engine:
            served = load_served_model(config, metrics)
        else:
            # One of several API processes: the engine process reports the engine's steps.
            served = connect_served_model(config)
        freeze_start_up_heap()
        return served

    settings = HttpSettings(api_key=config.api_key, name_process=not reports_engine)
    return create_http_app(ModelHolder(loader=load), settings, metrics)
