"""Composition root of a gunicorn worker: `adapters.cli.asgi:create_app()`.

The worker builds the app at import of this factory, and the model loads on ASGI startup, after
gunicorn has forked, so no model or device state ever crosses a fork.
"""

from __future__ import annotations

import logging
import os
import threading

import falcon.asgi

from adapters.cli import bootstrap
from adapters.cli.engine_thread import EngineLoop
from adapters.cli.serve_config import ServeConfig
from adapters.http.app import create_app as create_http_app
from adapters.http.serving import HttpSettings, ModelHolder, ServedModel
from adapters.metrics.prometheus import PrometheusMetrics
from domain.engine.engine import EngineConfig
from ports.metrics import EngineObserver

_log = logging.getLogger(__name__)
# After a tensor-parallel world breaks, the worker keeps answering (failed requests, an
# unhealthy /health) this long, then exits with this status so that gunicorn starts a fresh
# worker and world. 3 and 4 would make gunicorn halt instead.
FAILURE_GRACE_S = 2.0
FAILURE_EXIT_STATUS = 70


def _exit_after_failure(message: str) -> None:
    _log.critical("the model can no longer run (%s); exiting in %.0f s", message, FAILURE_GRACE_S)
    timer = threading.Timer(FAILURE_GRACE_S, os._exit, (FAILURE_EXIT_STATUS,))
    timer.daemon = True
    timer.start()


def load_served_model(config: ServeConfig, observer: EngineObserver | None = None) -> ServedModel:
    """Loads the model, starts the engine thread and describes what is served."""
    loaded = bootstrap.load(
        config.model,
        config.runner,
        EngineConfig(
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_logprobs=config.max_logprobs,
            speculative=config.speculative,
        ),
        config.served_model_name,
        observer,
        parallel=config.parallel,
        on_failure=_exit_after_failure,
    )
    loop = EngineLoop(loaded.engine)
    loop.start()

    def stop() -> None:
        loop.stop()
        loaded.close()

    return ServedModel(
        name=loaded.name,
        tokenizer=loaded.tokenizer,
        engine=loaded.engine,
        allow_logprobs=loaded.engine.logprob_top_k > 0,
        parsers=config.parsers,
        stop=stop,
        failure=loaded.failure,
    )


def create_app(config: ServeConfig | None = None) -> falcon.asgi.App:
    config = config or ServeConfig.from_environment()
    # One metrics object per app: the engine reports steps to it, the app counts errors in it.
    metrics = PrometheusMetrics(bootstrap.served_name(config.model, config.served_model_name))
    holder = ModelHolder(loader=lambda: load_served_model(config, metrics))
    return create_http_app(holder, HttpSettings(api_key=config.api_key), metrics)
