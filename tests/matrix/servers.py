"""The matrix's server configurations over one tiny model, each started the first time a cell
asks for it and stopped with the module.

Every server serves the marker model whose chat template opens `<think>` (so the parsers and
the thinking budget have blocks to work on), with the same runner settings except for the
feature the configuration is about. The parser configurations are apps over the plain
server's engine, as `--reasoning-parser` changes presentation only.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from adapters.cli.asgi import load_served_model
from adapters.cli.serve_config import ServeConfig
from adapters.gpu.factory import RunnerSettings
from adapters.gpu.model.config import ModelConfig
from adapters.gpu.model.kv_cache import PagedKVCache
from adapters.http.app import create_app
from adapters.http.serving import ModelHolder, ServedModel
from adapters.metrics.prometheus import PrometheusMetrics
from domain.parsers.settings import ParserSettings
from tests.support.generation_tap import GenerationTap
from tests.support.prometheus import Scrape

MODEL_NAME = "tiny"
MAX_MODEL_LEN = 128
BLOCK_SIZE = 8
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
# The tiny-KV server holds one sequence of its MAX_MODEL_LEN and no more: two choices that
# each grow past half of it cannot both stay, so one is preempted.
TINY_KV_MODEL_LEN = 80
TINY_KV_BLOCKS = TINY_KV_MODEL_LEN // BLOCK_SIZE


@dataclass
class MatrixServer:
    """One configuration: its app, the served model behind it and a tap on its engine."""

    name: str
    app: Any
    served: ServedModel
    tap: GenerationTap
    metrics: PrometheusMetrics

    def counts(self) -> dict[str, float]:
        """The counters the cells check, by their names without `vllm:` and `_total`."""
        scrape = Scrape(self.metrics.render().decode())
        found = {}
        for name in ("num_preemptions", "generation_tokens", "spec_decode_num_accepted_tokens"):
            try:
                found[name] = scrape.value(f"vllm:{name}_total", model_name=MODEL_NAME)
            except KeyError:  # a series not created until it first counts
                found[name] = 0.0
        return found


class MatrixServers:
    """Builds each configuration on first use; `close` stops everything it started."""

    def __init__(self, model_dir: Path, draft_dir: Path) -> None:
        self._model_dir = model_dir
        self._draft_dir = draft_dir
        self._servers: dict[str, MatrixServer] = {}
        self._stops: list[Callable[[], None]] = []

    def __getitem__(self, name: str) -> MatrixServer:
        if name not in self._servers:
            self._servers[name] = self._build(name)
        return self._servers[name]

    def close(self) -> None:
        for stop in reversed(self._stops):
            stop()

    def _build(self, name: str) -> MatrixServer:
        if name in ("qwen3", "deepseek_r1"):
            plain = self["plain"]
            parsers = ParserSettings(name, "hermes", auto_tool_choice=True)
            served = dataclasses.replace(plain.served, parsers=parsers)
            return MatrixServer(
                name, create_app(ModelHolder(served=served)), served, plain.tap, plain.metrics
            )
        options: dict[str, Any] = {
            "plain": {},
            "ngram": {"speculative_config": json.dumps(NGRAM)},
            "draft": {
                "speculative_config": json.dumps(
                    {
                        "method": "draft_model",
                        "model": str(self._draft_dir),
                        "num_speculative_tokens": 3,
                    }
                )
            },
            "tp2": {"tensor_parallel_size": 2},
            "prompt-logprobs": {"prompt_logprobs": True},
            "tiny-kv": {
                "max_model_len": TINY_KV_MODEL_LEN,
                "kv_cache_bytes": TINY_KV_BLOCKS * self._block_bytes(),
            },
        }[name]
        return self._serve(name, **options)

    def _block_bytes(self) -> int:
        config = ModelConfig.from_dir(self._model_dir)
        return PagedKVCache.bytes_per_block(config, BLOCK_SIZE, torch.float32)

    def _serve(
        self, name: str, speculative_config: str | None = None, **runner: Any
    ) -> MatrixServer:
        settings: dict[str, Any] = {
            "device": "cpu",
            "max_num_seqs": 4,
            "max_model_len": MAX_MODEL_LEN,
            "kv_cache_bytes": 16 << 20,
            "block_size": BLOCK_SIZE,
        }
        settings.update(runner)
        config = ServeConfig(
            model=str(self._model_dir),
            served_model_name=MODEL_NAME,
            runner=RunnerSettings(**settings),
            speculative_config=speculative_config,
        )
        metrics = PrometheusMetrics(MODEL_NAME)
        served = load_served_model(config, metrics)
        self._stops.append(served.stop)
        tap = GenerationTap(served.engine)
        return MatrixServer(name, create_app(ModelHolder(served=served)), served, tap, metrics)


def reference_rows(model_dir: Path) -> Callable[[list[int]], torch.Tensor]:
    """Token IDs -> float64 log_softmax of transformers' FP32 logits; row i predicts i + 1."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def rows(token_ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            logits = model(torch.tensor([token_ids])).logits[0]
        return torch.log_softmax(logits.double(), dim=-1)

    return rows
