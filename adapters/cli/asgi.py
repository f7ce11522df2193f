"""Composition root of a gunicorn worker: `adapters.cli.asgi:create_app()`.

The worker builds the app at import of this factory, and the model loads on ASGI startup, after
gunicorn has forked, so no model or device state ever crosses a fork.
"""

from __future__ import annotations

import falcon.asgi

from adapters.cli import bootstrap
from adapters.cli.serve_config import ServeConfig
from adapters.http.app import create_app as create_http_app
from adapters.http.serving import HttpSettings, ModelHolder, ServedModel
from adapters.metrics.prometheus import PrometheusMetrics
from domain.engine import EngineConfig, EngineLoop
from ports.metrics import EngineObserver


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
    )
    loop = EngineLoop(loaded.engine)
    loop.start()
    return ServedModel(
        name=loaded.name,
        tokenizer=loaded.tokenizer,
        engine=loaded.engine,
        allow_logprobs=loaded.engine.logprob_top_k > 0,
        parsers=config.parsers,
        stop=loop.stop,
    )


def create_app(config: ServeConfig | None = None) -> falcon.asgi.App:
    config = config or ServeConfig.from_environment()
    # One metrics object per app: the engine reports steps to it, the app counts errors in it.
    metrics = PrometheusMetrics(bootstrap.served_name(config.model, config.served_model_name))
    holder = ModelHolder(loader=lambda: load_served_model(config, metrics))
    return create_http_app(holder, HttpSettings(api_key=config.api_key), metrics)
