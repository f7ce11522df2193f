"""The real engine over a tiny real model: batching, preemption and aborts never change tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.tokenizer.hf import HfTokenizer
from domain.emission.outputs import ChoiceDelta, RequestEnd
from domain.engine.engine import Engine
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams
from domain.telemetry.step_stats import SchedulerState
from tests.fakes import RecordingObserver
from tests.support.draining import drain
from tests.support.engines import build_engine

pytestmark = pytest.mark.model

PROMPTS = [
    "Hello there",
    "The quick brown fox jumps over the lazy dog again and again",
    "数据 and émigré",
    "a",
    "Numbers 12345 and words, more words, and yet more words to make a long prompt",
    "🙂 ok",
]


def requests_for(tokenizer: HfTokenizer, params: list[SamplingParams]) -> list[EngineRequest]:
    return [
        EngineRequest(f"r{i}", tuple(tokenizer.encode(prompt)), p)
        for i, (prompt, p) in enumerate(zip(PROMPTS, params, strict=True))
    ]


def run(engine: Engine, requests: list[EngineRequest]) -> dict[str, list[int]]:
    return {
        request_id: [t for i in items if isinstance(i, ChoiceDelta) for t in i.token_ids]
        for request_id, items in drain(engine, requests).items()
    }


def alone(model_dir: Path, requests: list[EngineRequest]) -> dict[str, list[int]]:
    engine, _, _ = build_engine(model_dir, max_num_seqs=1, budget=512)
    return {r.request_id: run(engine, [r])[r.request_id] for r in requests}


def varied_params(greedy: bool) -> list[SamplingParams]:
    return [
        SamplingParams(
            max_tokens=6 + 3 * i,
            temperature=0.0 if greedy else 0.9,
            seed=100 + i,
            ignore_eos=True,
            top_p=1.0 if greedy else 0.95,
        )
        for i in range(len(PROMPTS))
    ]


def test_concurrent_greedy_requests_get_exactly_the_tokens_each_gets_alone(tiny_model_dir):
    engine, tokenizer, plans = build_engine(tiny_model_dir)
    requests = requests_for(tokenizer, varied_params(greedy=True))

    together = run(engine, requests)

    assert together == alone(tiny_model_dir, requests)
    assert max(len(plan.works) for plan in plans) > 1, "requests really shared steps"
    assert any(not w.sample for plan in plans for w in plan.works), "a prompt was chunked"


def test_concurrent_seeded_requests_sample_exactly_the_tokens_each_samples_alone(tiny_model_dir):
    engine, tokenizer, _ = build_engine(tiny_model_dir)
    requests = requests_for(tokenizer, varied_params(greedy=False))

    together = run(engine, requests)

    assert together == alone(tiny_model_dir, requests)
    assert len({tuple(tokens) for tokens in together.values()}) == len(requests)


def test_preemption_under_a_tiny_kv_budget_changes_no_output(tiny_model_dir):
    _, tokenizer, _ = build_engine(tiny_model_dir)
    block_bytes = _bytes_per_block(tiny_model_dir, block_size=4)
    steps = RecordingObserver()
    engine, _, plans = build_engine(
        tiny_model_dir, kv_bytes=block_bytes * 40, max_model_len=96, budget=64, observer=steps
    )
    requests = requests_for(
        tokenizer,
        [
            SamplingParams(
                max_tokens=30, temperature=0.0 if i % 2 else 0.8, seed=7 + i, ignore_eos=True
            )
            for i in range(len(PROMPTS))
        ],
    )

    together = run(engine, requests)

    restarts = [
        w
        for plan in plans
        for w in plan.works
        if w.start_position == 0 and len(w.token_ids) > w.prompt_len
    ]
    assert restarts, "the KV pool was small enough to force preemption"
    assert together == alone(tiny_model_dir, requests)
    assert steps.total("preemptions") > 0
    assert steps.state == SchedulerState(), "every slot and KV block is free again"


def test_abort_frees_the_slot_and_blocks_at_once(tiny_model_dir):
    steps = RecordingObserver()
    engine, tokenizer, _ = build_engine(tiny_model_dir, observer=steps)
    params = SamplingParams(max_tokens=50, ignore_eos=True, seed=1)
    channel = engine.submit(EngineRequest("long", tuple(tokenizer.encode(PROMPTS[1])), params))
    for _ in range(4):
        engine.step()
    assert steps.state.running == 1 and steps.state.kv_cache_usage > 0

    engine.abort("long")
    engine.step()

    assert steps.state == SchedulerState() and not engine.has_work()
    items = [channel.get_nowait() for _ in range(len(channel))]
    assert items[-2].finish_reason == "abort" and isinstance(items[-1], RequestEnd)


def _bytes_per_block(model_dir: Path, block_size: int) -> int:
    import torch

    from adapters.gpu.model.config import ModelConfig
    from adapters.gpu.model.kv_cache import PagedKVCache

    return PagedKVCache.bytes_per_block(ModelConfig.from_dir(model_dir), block_size, torch.float32)


def test_a_step_that_samples_nothing_uploads_no_logprob_flags(tiny_model_dir):
    from domain.engine.step import SlotWork, StepPlan
    from domain.logprobs.values import LogprobOptions
    from domain.requests.choice_sampling import LaneSampling

    engine, tokenizer, _ = build_engine(tiny_model_dir)
    executor = engine._executor
    outputs = executor._outputs
    outputs.buffers.requested.fill_(7)  # a sentinel the upload would overwrite
    prompt = tuple(tokenizer.encode(PROMPTS[1]))
    prefill_only = SlotWork(
        slot=0,
        epoch=1,
        token_ids=prompt[:4],
        start_position=0,
        block_table=(0, 1),
        prompt_len=len(prompt),
        sample=False,
        sampling=LaneSampling(SamplingParams(), 0, logprobs=LogprobOptions(top_k=2)),
    )

    result = executor.read(executor.submit(StepPlan((prefill_only,))))

    assert outputs.buffers.requested.tolist() == [7] * len(outputs.buffers.requested)
    assert result.logprobs == () and not result.records[0].emits
