"""The host-ceiling bench's simulated executor keeps the executor port, so `bench/host.py`
measures the production engine and bookkeeping rather than a broken stand-in."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.tokenizer.hf import HfTokenizer
from bench.simulated_executor import TEXT, SimulatedExecutor
from domain.contract.capabilities import FULL_LOGPROBS
from domain.contract.geometry import ExecutorGeometry
from domain.emission.outputs import ChoiceDelta, RequestEnd
from domain.engine.engine import Engine
from domain.engine.step import SlotWork, StepPlan
from domain.logprobs.rules import LogprobAsk
from domain.logprobs.values import LogprobOptions
from domain.requests.choice_sampling import LaneSampling
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams
from ports.executor import ModelExecutor
from tests.support.draining import drain
from tests.support.tokenizers import build_byte_level_bpe

MAX_TOKENS = 6


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> HfTokenizer:
    directory: Path = tmp_path_factory.mktemp("bpe")
    build_byte_level_bpe(directory, corpus=[TEXT] * 4)
    return HfTokenizer.from_dir(directory)


def _executor(tokenizer: HfTokenizer, **kwargs) -> SimulatedExecutor:
    geometry = ExecutorGeometry(
        capacity=8,
        block_size=4,
        num_blocks=256,
        vocab_size=tokenizer.vocab_size,
        max_model_len=128,
        token_capacity=8,
        logprobs=FULL_LOGPROBS,
    )
    return SimulatedExecutor(geometry, tokenizer.encode(TEXT, add_special_tokens=False), **kwargs)


def _follows_text(tokens: list[int], text: list[int]) -> bool:
    return any(
        all(text[(start + i) % len(text)] == token for i, token in enumerate(tokens))
        for start in range(len(text))
    )


def test_the_simulated_executor_serves_an_engine_text_and_logprobs_that_decode(tokenizer):
    executor: ModelExecutor = _executor(tokenizer)
    engine = Engine(executor, tokenizer)
    asks = {
        "off": LogprobAsk(),
        "k0": LogprobAsk(wanted=True, count=0),
        "k20": LogprobAsk(wanted=True, count=20),
        "ids": LogprobAsk(wanted=True, token_ids=(5, 9)),
    }
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    prompt = tuple(tokenizer.encode("the river bends"))
    requests = [EngineRequest(name, prompt, params, logprobs=ask) for name, ask in asks.items()]

    items = drain(engine, requests)

    text_ids = tokenizer.encode(TEXT, add_special_tokens=False)
    for name, found in items.items():
        deltas = [item for item in found if isinstance(item, ChoiceDelta)]
        tokens = [token for delta in deltas for token in delta.token_ids]
        entries = [entry.position for delta in deltas for entry in delta.logprobs]
        assert len(tokens) == MAX_TOKENS and _follows_text(tokens, text_ids), name
        assert "".join(delta.text for delta in deltas) == tokenizer.decode(tokens)
        assert deltas[-1].finish_reason == "length" and isinstance(found[-1], RequestEnd)
        if name == "off":
            assert entries == []
            continue
        assert [entry.chosen.token_id for entry in entries] == tokens, name
        assert all(-10 < entry.chosen.logprob < 0 for entry in entries)
        alternatives = [entry.alternatives for entry in entries]
        if name == "ids":
            assert [[a.token_id for a in alts] for alts in alternatives] == [[5, 9]] * MAX_TOKENS
        elif name == "k20":
            for entry, alts in zip(entries, alternatives, strict=True):
                values = [a.logprob for a in alts]
                assert len(alts) == 20 and values == sorted(values, reverse=True)
                assert alts[0] == entry.chosen
    tally = executor.tally
    assert tally.tokens == 4 * MAX_TOKENS and tally.requesting == 3 * MAX_TOKENS
    assert tally.submit_s > 0 and tally.read_s > 0


def test_each_simulated_step_sleeps_for_what_its_device_work_leaves_of_the_step(tokenizer):
    slept: list[float] = []
    # Each step's device work (the draw and the logprob words) reads the clock before and
    # after: 2 ms of it in the first step, 9 ms (more than the step) in the second.
    moments = iter([10.0, 10.002, 20.0, 20.009])
    executor = _executor(tokenizer, step_s=0.007, sleep=slept.append, clock=moments.__next__)
    ask = LogprobOptions(top_k=5)
    sampling = LaneSampling(SamplingParams(), seed=1, remaining=10, logprobs=ask)
    plan = StepPlan((SlotWork(0, 0, (3,), 4, (0, 1), 4, True, sampling),))

    executor.read(executor.submit(plan))
    executor.read(executor.submit(plan))

    assert slept == [pytest.approx(0.005), 0.0] and executor.tally.steps == 2
    assert executor.tally.requesting == 2
