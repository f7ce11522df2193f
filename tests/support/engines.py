"""A real engine over a model directory on the CPU, recording every plan its executor ran."""

from __future__ import annotations

from pathlib import Path

from adapters.gpu.background_executor import BackgroundExecutor
from adapters.gpu.factory import RunnerSettings, build_executor
from adapters.grammar.llguidance_compiler import LlguidanceCompiler
from adapters.tokenizer.hf import HfTokenizer
from domain.contract.capabilities import FULL_LOGPROBS, LogprobCapability
from domain.engine.engine import Engine, EngineConfig
from domain.engine.step import StepPlan
from domain.speculation.drafts import SpeculativeConfig
from ports.metrics import EngineObserver


def build_engine(
    model_dir: Path,
    *,
    kv_bytes: int = 8 << 20,
    max_num_seqs: int = 8,
    budget: int = 32,
    block_size: int = 4,
    max_model_len: int = 128,
    capability: LogprobCapability = FULL_LOGPROBS,
    speculative: SpeculativeConfig | None = None,
    grammars: LlguidanceCompiler | None = None,
    observer: EngineObserver | None = None,
    overlapped: bool = False,
    prefix_caching: str | None = "sha256",
    batch_invariant: bool = False,
    dtype: str = "auto",
) -> tuple[Engine, HfTokenizer, list[StepPlan]]:
    """(engine, tokenizer, plans): `plans` grows by each plan the executor is given.

    The defaults suit the tiny test models: chunked prefill within a 32-token budget. The
    engine and the executor share `grammars` (a fresh compiler by default); `observer` gets
    the engine's steps. `overlapped` runs the engine's async scheduling over the executor on
    a background thread, as `helios serve --async-scheduling` does. The prefix cache is on,
    as a server's is by default, unless `prefix_caching` is None; `batch_invariant` builds
    the model with the batch-invariant kernels (`helios serve --batch-invariant`); `dtype` is
    `--dtype`.
    """
    tokenizer = HfTokenizer.from_dir(model_dir)
    settings = RunnerSettings(
        device="cpu",
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        kv_cache_bytes=kv_bytes,
        block_size=block_size,
        batch_invariant=batch_invariant,
        dtype=dtype,
    )
    draft_dir = Path(speculative.model) if speculative and speculative.model else None
    grammars = grammars or LlguidanceCompiler(tokenizer)
    executor = build_executor(
        model_dir,
        settings,
        tokenizer.vocab_size,
        capability=capability,
        draft_dir=draft_dir,
        grammars=grammars,
    )
    plans: list[StepPlan] = []
    submit = executor.submit

    def spying_submit(plan):
        plans.append(plan)
        return submit(plan)

    executor.submit = spying_submit
    config = EngineConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        speculative=speculative,
        async_scheduling=overlapped,
        prefix_caching=prefix_caching,
    )
    runner = BackgroundExecutor(executor) if overlapped else executor
    engine = Engine(runner, tokenizer, config, grammars=grammars, observer=observer)
    return engine, tokenizer, plans
