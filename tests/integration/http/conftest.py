"""A tiny real model behind the Falcon ASGI app, shared by the HTTP integration tests."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from falcon import testing

from adapters.cli.asgi import load_served_model
from adapters.cli.serve_config import ServeConfig
from adapters.gpu.factory import RunnerSettings
from adapters.http.app import create_app
from adapters.http.serving import HttpSettings, ModelHolder, ServedModel
from domain.parsers.settings import ParserSettings
from tests.fakes import RecordingObserver
from tests.support.tiny_serving import build_tiny_model_dir

MODEL_NAME = "tiny"
MAX_MODEL_LEN = 128


@pytest.fixture(scope="session")
def http_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model_dir(tmp_path_factory.mktemp("http-tiny"))


def serve_tiny(
    model_dir: Path,
    *,
    max_num_batched_tokens: int | None = None,
    speculative_config: str | None = None,
    observer: RecordingObserver | None = None,
    async_scheduling: bool = False,
    prefix_caching: str | None = None,
    **runner: object,
) -> ServedModel:
    """The tiny model behind a started engine; the caller stops it.

    `runner` overrides RunnerSettings fields; without a token budget ServeConfig's default holds.
    `speculative_config` is `--speculative-config`'s JSON; `observer` gets the engine's steps;
    `async_scheduling` serves with the overlapped loop. The prefix cache is off unless
    `prefix_caching` names its hash: these servers' tests send the same prompt again and compare
    the answers bit for bit, usage included, which a cache hit may move (contracts/api.md,
    "Prefix caching"); test_prefix_caching_http serves with it.
    """
    settings = dict(
        device="cpu",
        max_num_seqs=8,
        max_model_len=MAX_MODEL_LEN,
        kv_cache_bytes=16 << 20,
        block_size=8,
    )
    settings.update(runner)
    budget = (
        {} if max_num_batched_tokens is None else {"max_num_batched_tokens": max_num_batched_tokens}
    )
    config = ServeConfig(
        model=str(model_dir),
        served_model_name=MODEL_NAME,
        runner=RunnerSettings(**settings),
        speculative_config=speculative_config,
        async_scheduling=async_scheduling,
        prefix_caching=prefix_caching,
        **budget,
    )
    return load_served_model(config, observer)


@pytest.fixture(scope="session")
def served_steps() -> RecordingObserver:
    """The steps of the shared served engine, as its observer sees them."""
    return RecordingObserver()


@pytest.fixture(scope="session")
def served(http_model_dir: Path, served_steps: RecordingObserver) -> Iterator[ServedModel]:
    model = serve_tiny(http_model_dir, observer=served_steps)
    yield model
    model.stop()


@pytest.fixture(scope="session")
def reference(http_model_dir: Path) -> Callable[[list[int]], torch.Tensor]:
    """Token IDs -> float64 log_softmax of transformers' FP32 logits; row i predicts token i + 1."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(http_model_dir, dtype=torch.float32).eval()

    def log_softmax_rows(token_ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            logits = model(torch.tensor([token_ids])).logits[0]
        return torch.log_softmax(logits.double(), dim=-1)

    return log_softmax_rows


@pytest.fixture(scope="session")
def app(served: ServedModel):
    return create_app(ModelHolder(served=served))


@pytest.fixture(scope="session")
def client(app) -> testing.TestClient:
    return testing.TestClient(app)


@pytest.fixture(scope="session")
def keyed_client(served: ServedModel) -> testing.TestClient:
    return testing.TestClient(create_app(ModelHolder(served=served), HttpSettings(api_key="sk-1")))


def parser_app(served: ServedModel, **settings: object):
    """The HTTP app over `served` with output parsers set as `ParserSettings(**settings)`
    (the same engine: a parser changes presentation only)."""
    parsers = ParserSettings(**settings)  # type: ignore[arg-type]
    return create_app(ModelHolder(served=dataclasses.replace(served, parsers=parsers)))
