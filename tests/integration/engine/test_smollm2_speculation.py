"""SmolLM2 with speculation on and off: identical greedy tokens over a few dozen prompts.

Bit equality fails where CPU GEMM kernels round differently for different row counts: a
verification forward has up to k + 1 rows per request, a decode step one. On this 30-layer
model that shape noise alone reaches 1.3e-5 without any speculation (the same 24 requests
batched against one at a time: 7 of 718 entries above 1e-5), and a self-drafting run, whose
every round verifies five rows, reaches 2.7e-5. So the bound here is 3e-5 (1e-5 on the tiny
model), and at least a third of the entries must stay bit-identical: the differences are
rounding, not a systematic shift.

History (n-gram) speculation and a draft model (SmolLM2 itself: no smaller model with its
vocabulary ships offline, and a draft equal to the target must have every draft accepted,
which pins the draft cache's bookkeeping on a real model). Values may differ from the run
without speculation by CPU rounding only; top-20 IDs may swap only at near-ties.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from adapters.cli import bootstrap
from adapters.gpu.factory import RunnerSettings
from adapters.gpu.loading.default_model import default_model_dir
from domain.emission.outputs import ChoiceDelta
from domain.engine.engine import Engine, EngineConfig
from domain.logprobs.rules import LogprobAsk
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams
from domain.speculation.drafts import SpeculativeConfig, SpeculativeMethod
from domain.telemetry.step_stats import StepStats
from tests.support.draining import drain

pytestmark = [pytest.mark.slow, pytest.mark.model]

PASSAGE = (
    "The library opens at nine in the morning and closes at six in the evening. Members may "
    "borrow up to five books at a time."
)
COPYING = [
    f"Repeat the following text exactly, word for word:\n\n{PASSAGE}",
    f"Quote this notice back to me verbatim:\n\n{PASSAGE}",
    "Write the word 'hello' ten times, separated by commas.",
    "Count from one to twenty in words.",
    "List the days of the week, then list them again.",
    "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox.",
    "Spell the word 'banana' letter by letter, twice.",
    "Write the alphabet in capital letters.",
]
OPEN = [
    "What is the capital of France?",
    "Why is the sky blue?",
    "Write a haiku about autumn.",
    "Explain photosynthesis briefly.",
    "Give me a tip for learning Python.",
    "Describe a cat in one sentence.",
    "What does a CPU do?",
    "Suggest a name for a dog.",
    "What is a prime number?",
    "Who wrote Hamlet?",
    "Name three primary colours.",
    "How many legs does a spider have?",
    "What is 17 times 3?",
    "Why do we sleep?",
    "Translate hello to Spanish.",
    "What is the boiling point of water?",
]
MAX_TOKENS = 40
SHAPE_NOISE = 3e-5


class Acceptance:
    """Adds up the engine's speculation counts."""

    def __init__(self) -> None:
        self.offered = self.accepted = 0

    def record_step(self, stats: StepStats) -> None:
        self.offered += stats.spec_draft_tokens
        self.accepted += stats.spec_accepted_tokens


def load(speculative: SpeculativeConfig | None, observer: Acceptance | None = None) -> Engine:
    runner = RunnerSettings(
        device="cpu", max_num_seqs=24, max_model_len=1024, kv_cache_bytes=256 << 20
    )
    config = EngineConfig(max_num_batched_tokens=1024, speculative=speculative)
    return bootstrap.load(None, runner, config, observer=observer).engine


@pytest.fixture(scope="module")
def requests() -> list[EngineRequest]:
    from adapters.tokenizer.hf import HfTokenizer

    tokenizer = HfTokenizer.from_dir(default_model_dir(progress=False))
    found = []
    for index, question in enumerate(COPYING + OPEN):
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": question}])
        prompt = tuple(tokenizer.encode(rendered, add_special_tokens=False))
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
        found.append(EngineRequest(f"q{index}", prompt, params, logprobs=LogprobAsk(True, 20)))
    return found


@pytest.fixture(scope="module")
def plain(requests) -> dict[str, list]:
    return drain(load(None), requests)


def entries(items: list) -> list:
    return [e.position for i in items if isinstance(i, ChoiceDelta) for e in i.logprobs]


def tokens(items: list) -> list[int]:
    return [t for i in items if isinstance(i, ChoiceDelta) for t in i.token_ids]


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(SpeculativeConfig(SpeculativeMethod.NGRAM, 4, 2, 4), id="ngram"),
        pytest.param("draft", id="draft-model"),
    ],
)
def speculative(request, requests) -> Iterator[tuple[dict[str, list], Acceptance, str]]:
    config = request.param
    if config == "draft":
        model = str(default_model_dir(progress=False))
        config = SpeculativeConfig(SpeculativeMethod.DRAFT_MODEL, 4, model=model)
    acceptance = Acceptance()
    yield drain(load(config, acceptance), requests), acceptance, config.method.value


def test_speculation_changes_no_greedy_token_on_smollm2(plain, speculative):
    found, acceptance, method = speculative

    for name, items in plain.items():
        assert tokens(found[name]) == tokens(items), name
    assert acceptance.accepted > 50, (acceptance.offered, acceptance.accepted)
    if method == "draft_model":
        # A draft equal to the target stands wherever it is emitted: only drafts after a
        # choice's terminating token, at most 4 in its last round, are offered but not counted.
        assert 0 <= acceptance.offered - acceptance.accepted <= 4 * len(plain)


def test_values_stay_within_1e_5_and_top_20_ids_agree_but_for_near_ties(plain, speculative):
    found, _, _ = speculative
    near_ties = identical = compared = 0

    for name, items in plain.items():
        for off, on in zip(entries(items), entries(found[name]), strict=True):
            assert off.chosen.token_id == on.chosen.token_id
            assert abs(off.chosen.logprob - on.chosen.logprob) <= SHAPE_NOISE
            identical += off.chosen.logprob == on.chosen.logprob
            compared += 1
            ids_off = [a.token_id for a in off.alternatives]
            ids_on = [a.token_id for a in on.alternatives]
            if ids_off != ids_on:
                near_ties += 1
                values = {a.token_id: a.logprob for a in off.alternatives}
                for x, y in zip(ids_off, ids_on, strict=True):
                    if x != y and y in values:
                        assert abs(values[x] - values[y]) <= 2e-5, (name, x, y)
    assert near_ties <= 5
    assert identical * 3 >= compared, (identical, compared)
