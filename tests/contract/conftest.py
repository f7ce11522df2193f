"""Fixtures: one real tiny model, served in-process by the HTTP app, for the whole session."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import falcon.asgi
import pytest

from adapters.http.app import create_app
from adapters.http.serving import HttpSettings, ModelHolder, ServedModel

SERVED_NAME = "tiny"
API_KEY = "contract-key"
MAX_MODEL_LEN = 128
# Enough KV blocks for several full-length sequences of the tiny model, small enough for CI.
KV_CACHE_BYTES = 16 << 20


@pytest.fixture(scope="session")
def served_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedModel]:
    # Imported here: they bring in torch, which collecting `make test-fast` should not pay for.
    from adapters.cli.asgi import load_served_model
    from adapters.cli.serve_config import ServeConfig
    from adapters.gpu.factory import RunnerSettings
    from tests.support.tiny_serving import build_tiny_model_dir

    model_dir = build_tiny_model_dir(tmp_path_factory.mktemp("contract-model"))
    config = ServeConfig(
        model=str(model_dir),
        served_model_name=SERVED_NAME,
        # Prompt scoring on, so fuzzed prompt logprob requests reach the model.
        runner=RunnerSettings(
            device="cpu",
            max_model_len=MAX_MODEL_LEN,
            kv_cache_bytes=KV_CACHE_BYTES,
            prompt_logprobs=True,
        ),
    )
    served = load_served_model(config)
    try:
        yield served
    finally:
        served.stop()


@pytest.fixture(scope="session")
def contract_app(served_model: ServedModel) -> falcon.asgi.App:
    # Schemathesis ends the app's ASGI lifespan after every test item, and the holder stops its
    # model on shutdown; the session's model must outlive each item, so the app gets a no-op stop.
    return create_app(ModelHolder(served=replace(served_model, stop=_keep_running)))


@pytest.fixture(scope="session")
def secured_app(served_model: ServedModel) -> falcon.asgi.App:
    """The same model behind an app that wants `API_KEY` on `/v1` routes."""
    holder = ModelHolder(served=replace(served_model, stop=_keep_running))
    return create_app(holder, HttpSettings(api_key=API_KEY))


# tryfirst: the marker must be on before `-m` deselects by it.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Contract tests that load the tiny model are marked `model`, so `make test-fast` can
    leave them to `make test`."""
    for item in items:
        if "served_model" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.model)


def _keep_running() -> None:
    """The session fixture, not the app's lifespan, stops the shared model."""
