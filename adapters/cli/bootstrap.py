"""Composition root: wires the tokenizer, the torch executor and the engine for one model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from adapters.core.export import CoreSizes, resolve_core
from adapters.gpu.background_executor import BackgroundExecutor
from adapters.gpu.distributed.launch import ParallelLaunch, start_world
from adapters.gpu.factory import ExecutorRecipe, RunnerSettings
from adapters.gpu.loading.default_model import resolve_model_dir
from adapters.grammar.llguidance_compiler import LlguidanceCompiler
from adapters.tokenizer.hf import HfTokenizer
from domain.engine.engine import Engine, EngineConfig
from domain.speculation.drafts import SpeculativeConfig
from ports.executor import ModelExecutor
from ports.metrics import EngineObserver

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class LoadedModel:
    """A ready engine with the tokenizer that feeds it and the name it is served under."""

    engine: Engine
    tokenizer: HfTokenizer
    name: str
    model_dir: Path
    # Why the model can no longer run (a tensor-parallel peer failed), or None while it can.
    failure: Callable[[], str | None] = lambda: None
    # Releases what the engine holds beyond this process (tensor-parallel peers).
    close: Callable[[], None] = field(default=lambda: None)


def load(
    model: str | None,
    runner: RunnerSettings,
    engine_config: EngineConfig,
    served_model_name: str | None = None,
    observer: EngineObserver | None = None,
    parallel: ParallelLaunch | None = None,
    on_failure: Callable[[str], None] = lambda message: None,
    progress: bool = True,
) -> LoadedModel:
    """Resolves the model (None means the embedded SmolLM2), loads it and builds the engine;
    `observer` receives the engine's step stats.

    With `runner.tensor_parallel_size` > 1 this process becomes rank 0 of a world started as
    `parallel` says; `on_failure` hears once if the world breaks. `progress` shows the GGUF
    export's and the weight loading's bars on stderr (rank 0's only)."""
    sizes = CoreSizes(
        runner.max_num_seqs,
        runner.token_capacity,
        engine_config.max_num_batched_tokens if runner.prompt_logprobs else 0,
    )
    core = resolve_core(model, sizes, progress=progress)
    model_dir = core.model_dir
    tokenizer = HfTokenizer.from_dir(model_dir)
    recipe = ExecutorRecipe(
        model_dir,
        runner,
        tokenizer.vocab_size,
        capability=core.capability,
        capacity=core.capacity,
        token_capacity=core.token_capacity,
        draft_dir=_draft_dir(engine_config.speculative, tokenizer, progress),
        progress=progress,
    )
    config = replace(engine_config, max_num_seqs=runner.max_num_seqs)
    name = served_name(model, served_model_name)
    # One compiler (and so one grammar cache) for the admission check and rank 0's executor.
    grammars = LlguidanceCompiler(tokenizer)
    if runner.tensor_parallel_size == 1:
        executor = _overlapped(recipe.build(grammars=grammars), config)
        engine = Engine(executor, tokenizer, config, observer=observer, grammars=grammars)
        return LoadedModel(engine, tokenizer, name, model_dir)
    world = start_world(
        replace(recipe, structured_outputs=True), parallel, on_failure=on_failure, grammars=grammars
    )
    executor = _overlapped(world.executor, config)
    engine = Engine(executor, tokenizer, config, observer=observer, grammars=grammars)
    return LoadedModel(
        engine,
        tokenizer,
        name,
        model_dir,
        failure=lambda: world.executor.failure,
        close=world.close,
    )


def _overlapped(executor: ModelExecutor, config: EngineConfig) -> ModelExecutor:
    """Under async scheduling the executor runs each step on its own thread, so that the engine
    plans the next step and emits the last one meanwhile."""
    return BackgroundExecutor(executor) if config.async_scheduling else executor


def _draft_dir(
    speculative: SpeculativeConfig | None, tokenizer: HfTokenizer, progress: bool
) -> Path | None:
    """The draft model's directory, after checking it tokenizes exactly as the target does."""
    if speculative is None or speculative.model is None:
        return None
    draft_dir = resolve_model_dir(speculative.model, progress=progress)
    draft = HfTokenizer.from_dir(draft_dir)
    same = draft.vocab_size == tokenizer.vocab_size and all(
        draft.token_bytes(token_id) == tokenizer.token_bytes(token_id)
        for token_id in range(tokenizer.vocab_size)
    )
    if not same:
        raise ValueError(
            f"the draft model {speculative.model!r} does not share the target's vocabulary "
            f"({draft.vocab_size} against {tokenizer.vocab_size} tokens, or different token "
            f"bytes); speculative decoding needs the same tokenizer"
        )
    return draft_dir


def served_name(model: str | None, served_model_name: str | None = None) -> str:
    """The name clients use: `--served-model-name`, else the model path, else the default's."""
    return served_model_name or model or DEFAULT_MODEL_NAME
