"""A tiny Mistral whose every layer has a sliding window: blocks outside the window go back to
the pool while sequences run, and every token, logprob and prompt score stays what it is when
every block is kept."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from adapters.gpu.background_executor import BackgroundExecutor
from adapters.gpu.factory import RunnerSettings, build_executor
from adapters.tokenizer.hf import HfTokenizer
from domain.contract.capabilities import LogprobCapability
from domain.contract.geometry import ExecutorGeometry
from domain.engine.engine import Engine, EngineConfig
from domain.logprobs.rules import LogprobAsk
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams
from ports.executor import ModelExecutor
from tests.fakes import RecordingObserver
from tests.support.draining import ended_items, step_until_idle, whole_outputs
from tests.support.tiny_models import build_tiny_mistral
from tests.support.tokenizers import build_byte_level_bpe

pytestmark = pytest.mark.model

WINDOW = 32
BLOCK = 4
VOCAB = 320
SCORING = LogprobCapability(top_k=20, selects_ids=True, scored_capacities=(32,))
PREFIX = "the quick brown fox jumps over the lazy dog"
MAX_MODEL_LEN = 192


class _KeepingEveryBlock:
    """The executor as it is, but declaring no window: the engine then keeps every block."""

    def __init__(self, executor: ModelExecutor) -> None:
        self._executor = executor
        self.geometry: ExecutorGeometry = dataclasses.replace(executor.geometry, kv_window=None)

    def __getattr__(self, name: str) -> object:
        return getattr(self._executor, name)


@pytest.fixture(scope="module")
def swa_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("swa") / "mistral"
    build_tiny_mistral(directory, vocab_size=VOCAB, sliding_window=WINDOW)
    build_byte_level_bpe(directory, vocab_size=VOCAB)
    return directory


def _requests(tokenizer: HfTokenizer) -> list[EngineRequest]:
    prompt = tuple(tokenizer.encode(PREFIX))
    ask = LogprobAsk(wanted=True, count=2)
    greedy = SamplingParams(max_tokens=120, temperature=0.0, ignore_eos=True)
    sampled = SamplingParams(max_tokens=120, temperature=0.9, seed=3, ignore_eos=True)
    return [
        EngineRequest("greedy", prompt, greedy, logprobs=ask),
        # The same prompt again: its leading blocks come from the prefix cache.
        EngineRequest("sampled", prompt, sampled, logprobs=ask),
        EngineRequest("other", tuple(tokenizer.encode("every request gets its own slot")), greedy),
        EngineRequest(
            "scored",
            prompt + prompt,
            SamplingParams(max_tokens=4, temperature=0.0),
            logprobs=LogprobAsk(wanted=True, count=2, prompt_logprobs=2),
        ),
    ]


def _run(
    model_dir: Path, *, keep_every_block: bool, kv_bytes: int, overlapped: bool
) -> tuple[dict, float]:
    """Each request's whole outputs, and the largest fraction of the pool held at once."""
    tokenizer = HfTokenizer.from_dir(model_dir)
    settings = RunnerSettings(
        device="cpu",
        max_num_seqs=4,
        max_model_len=MAX_MODEL_LEN,
        kv_cache_bytes=kv_bytes,
        block_size=BLOCK,
    )
    executor: ModelExecutor = build_executor(
        model_dir, settings, tokenizer.vocab_size, capability=SCORING
    )
    if keep_every_block:
        executor = _KeepingEveryBlock(executor)  # type: ignore[assignment]
    num_blocks = executor.geometry.num_blocks
    if overlapped:
        executor = BackgroundExecutor(executor)
    observer = RecordingObserver()
    config = EngineConfig(
        max_num_seqs=4,
        max_num_batched_tokens=32,
        prefix_caching="sha256",
        async_scheduling=overlapped,
    )
    engine = Engine(executor, tokenizer, config, observer=observer)
    channels = {r.request_id: engine.submit(r) for r in _requests(tokenizer)}
    step_until_idle(engine)
    outputs = {rid: whole_outputs(items) for rid, items in ended_items(channels).items()}
    peak = max(step.state.kv_cache_usage for step in observer.steps)
    return outputs, peak * num_blocks


@pytest.mark.parametrize("overlapped", [False, True])
def test_freeing_blocks_outside_the_window_changes_no_token_logprob_or_score(
    swa_dir: Path, overlapped: bool
) -> None:
    # A position's keys and values: 2 layers of 2 heads of 16 float32s each: 512 bytes.
    kept, kept_peak = _run(
        swa_dir, keep_every_block=True, kv_bytes=1200 * 512, overlapped=overlapped
    )
    # The smallest pool the engine accepts (one sequence of MAX_MODEL_LEN): the run's positions
    # far outnumber it, so freed blocks are taken again by the other sequences while their
    # first owners still run, and their new contents sit under the window's mask.
    pool = MAX_MODEL_LEN // BLOCK
    freed, freed_peak = _run(
        swa_dir, keep_every_block=False, kv_bytes=MAX_MODEL_LEN * 512, overlapped=overlapped
    )
    assert freed == kept
    assert freed_peak <= pool < kept_peak
