"""Composition root: wires the tokenizer, the torch executor and the engine for one model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from adapters.gpu.default_model import resolve_model_dir
from adapters.gpu.factory import RunnerSettings, build_executor
from adapters.tokenizer.hf import HfTokenizer
from domain.engine import Engine, EngineConfig


@dataclass(frozen=True)
class LoadedModel:
    """A ready engine with the tokenizer that feeds it and the name it is served under."""

    engine: Engine
    tokenizer: HfTokenizer
    name: str
    model_dir: Path


def load(
    model: str | None,
    runner: RunnerSettings,
    engine_config: EngineConfig,
    served_model_name: str | None = None,
) -> LoadedModel:
    """Resolves the model (None means the embedded SmolLM2), loads it and builds the engine."""
    model_dir = resolve_model_dir(model)
    tokenizer = HfTokenizer.from_dir(model_dir)
    executor = build_executor(model_dir, runner, tokenizer.vocab_size)
    config = EngineConfig(
        max_num_seqs=runner.max_num_seqs,
        max_num_batched_tokens=engine_config.max_num_batched_tokens,
        max_waiting=engine_config.max_waiting,
        channel_capacity=engine_config.channel_capacity,
    )
    engine = Engine(executor, tokenizer, config)
    name = served_model_name or (model if model else "SmolLM2-135M-Instruct")
    return LoadedModel(engine, tokenizer, name, model_dir)
