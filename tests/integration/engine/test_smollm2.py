"""The embedded SmolLM2-135M-Instruct answers a real question through the real engine."""

from __future__ import annotations

import pytest

from adapters.cli import bootstrap
from adapters.gpu.factory import RunnerSettings
from domain.emission.outputs import ChoiceDelta
from domain.engine.engine import EngineConfig
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams
from tests.support.draining import drain

pytestmark = [pytest.mark.slow, pytest.mark.model]


def test_smollm2_greedy_answer_to_the_capital_of_france_mentions_paris():
    loaded = bootstrap.load(
        None,
        RunnerSettings(device="cpu", max_model_len=1024, kv_cache_bytes=64 << 20),
        EngineConfig(),
    )
    chat = loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}]
    )
    prompt = tuple(loaded.tokenizer.encode(chat, add_special_tokens=False))

    request = EngineRequest("paris", prompt, SamplingParams(max_tokens=30, temperature=0.0))
    items = drain(loaded.engine, [request])["paris"]

    text = "".join(i.text for i in items if isinstance(i, ChoiceDelta))
    assert "Paris" in text
