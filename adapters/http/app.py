"""The Falcon ASGI application: routes, media, middleware and error handlers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import falcon.asgi

from adapters.http import errors
from adapters.http.auth import ApiKeyMiddleware
from adapters.http.metrics import MetricsResource
from adapters.http.process_header import ProcessHeaderMiddleware
from adapters.http.resources import HealthResource, ModelsResource, OpenApiResource
from adapters.http.serving import HttpSettings, ModelHolder
from adapters.http.serving_chat import ChatCompletionsResource
from adapters.http.serving_completion import CompletionsResource
from adapters.http.serving_responses import ResponsesResource
from adapters.http.serving_tokenization import DetokenizeResource, TokenizeResource
from adapters.metrics.prometheus import PrometheusMetrics
from domain.responses.store import ResponseStore

OPENAPI_PATH = Path(__file__).resolve().parents[2] / "contracts" / "openapi.yaml"


def create_app(
    holder: ModelHolder,
    settings: HttpSettings | None = None,
    metrics: PrometheusMetrics | None = None,
) -> falcon.asgi.App:
    """`metrics` should be the engine's observer too; by default the app gets metrics of its own
    (a fresh registry), which count its rejections only."""
    settings = settings or HttpSettings()
    if metrics is None:
        metrics = PrometheusMetrics(holder.served.name if holder.loaded else "")
    middleware: list[Any] = [holder]
    if settings.api_key:
        middleware.append(ApiKeyMiddleware(settings.api_key))
    if settings.name_process:
        middleware.append(ProcessHeaderMiddleware())
    app = falcon.asgi.App(middleware=middleware)
    app.req_options.strip_url_path_trailing_slash = True
    app.add_route("/v1/completions", CompletionsResource(holder, settings))
    app.add_route("/v1/chat/completions", ChatCompletionsResource(holder, settings))
    responses = ResponsesResource(holder, settings, ResponseStore())
    app.add_route("/v1/responses", responses)
    app.add_route("/v1/responses/{response_id}", responses, suffix="item")
    app.add_route("/v1/models", ModelsResource(holder))
    app.add_route("/health", HealthResource(holder))
    app.add_route("/tokenize", TokenizeResource(holder, settings))
    app.add_route("/detokenize", DetokenizeResource(holder, settings))
    app.add_route("/openapi.json", OpenApiResource(OPENAPI_PATH))
    app.add_route("/metrics", MetricsResource(metrics))
    errors.register(app, metrics)
    return app
