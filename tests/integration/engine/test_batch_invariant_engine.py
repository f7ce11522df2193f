"""Batch-invariant mode on a tiny model: batch, chunk size and speculation change no bit.

The same requests (natural top-20, selected IDs, prompt scores; greedy and seeded sampling)
run one at a time without chunking, then all together under budgets of 16, 64 and 256 tokens,
and with n-gram speculation (greedy requests: a sampled lane's speculation keeps the
distribution, not the draws). Every payload must be identical to the last bit: `repr` of a
float round-trips it, so equal reprs are equal bits. The default mode keeps its kernels: the
same tokens, values within float32 rounding of the invariant ones.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from domain.contract.capabilities import LogprobCapability, scored_capacities
from domain.emission.outputs import ChoiceDelta, PromptScores
from domain.logprobs.rules import LogprobAsk
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams
from domain.speculation.drafts import SpeculativeConfig, SpeculativeMethod
from domain.telemetry.step_stats import StepStats
from tests.support.draining import drain
from tests.support.engines import build_engine
from tests.support.tiny_serving import TINY_VOCAB

pytestmark = pytest.mark.model

NGRAM = SpeculativeConfig(SpeculativeMethod.NGRAM, 4, 1, 3)
UNCHUNKED = 256
MAX_MODEL_LEN = 192


def prompt(seed: int, vocab: int) -> tuple[int, ...]:
    """Random tokens with a repeated phrase, so that n-gram drafts are offered and accepted."""
    generator = random.Random(seed)
    phrase = [generator.randrange(3, vocab) for _ in range(generator.randint(3, 6))]
    noise = [generator.randrange(3, vocab) for _ in range(generator.randint(5, 60))]
    return tuple(noise + phrase * 3 + phrase[: generator.randint(1, len(phrase))])


def requests(vocab: int) -> list[EngineRequest]:
    found = []
    for index in range(8):
        sampling = (
            SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
            if index % 3
            else SamplingParams(max_tokens=16, temperature=0.8, seed=index, ignore_eos=True)
        )
        ask = (
            LogprobAsk(True, 20, prompt_logprobs=20)
            if index % 2
            else LogprobAsk(True, 4, token_ids=(3, 5, 11, 40))
        )
        found.append(EngineRequest(f"r{index}", prompt(index, vocab), sampling, logprobs=ask))
    return found


class Acceptance:
    def __init__(self) -> None:
        self.offered = self.accepted = self.preemptions = 0

    def record_step(self, stats: StepStats) -> None:
        self.offered += stats.spec_draft_tokens
        self.accepted += stats.spec_accepted_tokens
        self.preemptions += stats.preemptions


def run(
    model_dir: Path,
    *,
    budget: int,
    one_at_a_time: bool = False,
    speculative: SpeculativeConfig | None = None,
    batch_invariant: bool = True,
    observer: Acceptance | None = None,
    kv_bytes: int = 16 << 20,
) -> dict[str, list]:
    """Each request's channel items."""
    capability = LogprobCapability(
        top_k=20, selects_ids=True, scored_capacities=scored_capacities(budget)
    )
    engine, tokenizer, _ = build_engine(
        model_dir,
        budget=budget,
        max_model_len=MAX_MODEL_LEN,
        kv_bytes=kv_bytes,
        capability=capability,
        speculative=speculative,
        batch_invariant=batch_invariant,
        observer=observer,
    )
    asked = requests(tokenizer.vocab_size)
    if not one_at_a_time:
        return drain(engine, asked)
    items = {}
    for request in asked:
        items.update(drain(engine, [request]))
    return items


def exact(items: dict[str, list]) -> dict[str, list[str]]:
    """Each request's payloads as exact reprs: every token, logprob entry and prompt score by
    position (however many a delta or a publication carried)."""
    found: dict[str, list[str]] = {}
    for name, channel in items.items():
        payloads = found.setdefault(name, [])
        for item in channel:
            if isinstance(item, ChoiceDelta):
                payloads.extend(f"token {t}" for t in item.token_ids)
                payloads.extend(repr(entry.position) for entry in item.logprobs)
            elif isinstance(item, PromptScores):
                first = item.first_position
                payloads.extend(f"{first + i} {s!r}" for i, s in enumerate(item.scores))
    return {name: sorted(payloads) for name, payloads in found.items()}


def chosen(channel: list) -> list[tuple[int, float]]:
    return [
        (entry.position.chosen.token_id, entry.position.chosen.logprob)
        for item in channel
        if isinstance(item, ChoiceDelta)
        for entry in item.logprobs
    ]


@pytest.fixture(scope="module")
def alone(tiny_model_dir: Path) -> dict[str, list]:
    return run(tiny_model_dir, budget=UNCHUNKED, one_at_a_time=True)


@pytest.mark.parametrize("budget", [16, 64, UNCHUNKED])
def test_batched_and_chunked_runs_equal_single_unchunked_runs_to_the_bit(
    tiny_model_dir, alone, budget
):
    together = run(tiny_model_dir, budget=budget)

    assert exact(together) == exact(alone)
    assert all(any(isinstance(i, PromptScores) for i in c) for c in list(alone.values())[1::2])


def test_ngram_speculation_changes_no_bit_of_a_greedy_request(tiny_model_dir, alone):
    acceptance = Acceptance()
    speculated = exact(run(tiny_model_dir, budget=64, speculative=NGRAM, observer=acceptance))
    expected = exact(alone)

    # Every offered draft is verified in a chunk of several rows; accepted ones emit from them.
    assert acceptance.offered >= 30 and acceptance.accepted >= 5, acceptance.__dict__
    # A sampled lane accepts a draft with probability p(draft): the same distribution, not the
    # same draws, so only greedy requests must match.
    greedy = [r.request_id for r in requests(TINY_VOCAB) if r.params.temperature == 0.0]
    assert len(greedy) >= 4
    for name in greedy:
        assert speculated[name] == expected[name], name


def test_requests_preempted_and_recomputed_equal_uninterrupted_ones_to_the_bit(
    tiny_model_dir, alone
):
    # 64 blocks of 4 positions: far fewer than the requests hold together (about 700).
    pressure = Acceptance()
    squeezed = run(tiny_model_dir, budget=64, kv_bytes=128 << 10, observer=pressure)

    assert pressure.preemptions > 0
    assert exact(squeezed) == exact(alone)


def test_the_default_mode_samples_the_same_greedy_tokens_with_values_within_rounding(
    tiny_model_dir, alone
):
    default = run(tiny_model_dir, budget=64, batch_invariant=False)

    for index, request in enumerate(requests(TINY_VOCAB)):
        if request.params.temperature != 0.0:
            continue
        name = request.request_id
        pairs = zip(chosen(default[name]), chosen(alone[name]), strict=True)
        for (token, value), (expected_token, expected_value) in pairs:
            assert token == expected_token, (name, index)
            assert value == pytest.approx(expected_value, abs=1e-5)
