"""History speculation on the torch executor: same greedy tokens, exact target logprobs.

Every test runs the same requests with speculation off and on over a tiny model and checks
that drafts were offered and accepted. The verifier's raw target rows are captured, so each
reported value is compared with the float64 log_softmax of the very row it came from.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from domain.contract.frames import FrameResult
from domain.contract.records import Role
from domain.emission.outputs import ChoiceDelta
from domain.engine.engine import Engine
from domain.engine.step import StepPlan
from domain.logprobs.rules import LogprobAsk
from domain.logprobs.values import PositionLogprobs
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams
from domain.speculation.drafts import SpeculativeConfig, SpeculativeMethod
from tests.support.draining import drain
from tests.support.engines import build_engine

pytestmark = pytest.mark.model

NGRAM = SpeculativeConfig(SpeculativeMethod.NGRAM, 4, 1, 3)
GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
# FP32 `logit - lse` against float64 log_softmax of the same FP32 row: one rounding of each.
FP32_ROUNDING = 4e-6


@dataclass
class Capture:
    """What the torch executor projected and committed, step by step."""

    logits: list[torch.Tensor] = field(default_factory=list)  # float32 [R, V] per step
    plans: list[StepPlan] = field(default_factory=list)
    results: list[FrameResult] = field(default_factory=list)

    def records(self, role: Role) -> list:
        return [r for result in self.results for r in result.records if r.role is role]


def spied_engine(
    model_dir: Path, speculative: SpeculativeConfig | None, **options
) -> tuple[Engine, Capture]:
    engine, _, _ = build_engine(model_dir, speculative=speculative, **options)
    capture = Capture()
    executor = engine._executor  # noqa: SLF001 - the test watches the executor's own rows
    model = executor._model  # noqa: SLF001
    project, submit, read = model.compute_logits, executor.submit, executor.read

    def compute_logits(hidden):
        logits = project(hidden)
        capture.logits.append(logits.detach().clone())
        return logits

    def spy_submit(plan):
        capture.plans.append(plan)
        return submit(plan)

    def spy_read(frame):
        result = read(frame)
        capture.results.append(result)
        return result

    model.compute_logits = compute_logits
    executor.submit, executor.read = spy_submit, spy_read
    return engine, capture


def repetitive_prompt(seed: int, vocab: int) -> tuple[int, ...]:
    generator = random.Random(seed)
    phrase = [generator.randrange(3, vocab) for _ in range(generator.randint(3, 7))]
    noise = [generator.randrange(3, vocab) for _ in range(generator.randint(0, 4))]
    return tuple(noise + phrase * 3 + phrase[: generator.randint(1, len(phrase))])


def prompts(vocab: int) -> list[tuple[int, ...]]:
    generator = random.Random(99)
    plain = [tuple(generator.randrange(3, vocab) for _ in range(12)) for _ in range(8)]
    return [repetitive_prompt(seed, vocab) for seed in range(16)] + plain


def entries(items: list) -> list[PositionLogprobs]:
    return [e.position for i in items if isinstance(i, ChoiceDelta) for e in i.logprobs]


def tokens(items: list) -> list[int]:
    return [t for i in items if isinstance(i, ChoiceDelta) for t in i.token_ids]


def run_both(model_dir: Path, requests: list[EngineRequest], **options):
    plain_engine, _ = spied_engine(model_dir, None, **options)
    plain = drain(plain_engine, requests)
    engine, capture = spied_engine(model_dir, NGRAM, **options)
    speculative = drain(engine, requests)
    return plain, speculative, capture


def target_rows(capture: Capture) -> dict[tuple[int, int], torch.Tensor]:
    """(step, emitted position) of each speculative lane -> the raw row the verifier used."""
    rows = {}
    for step, (plan, logits, result) in enumerate(
        zip(capture.plans, capture.logits, capture.results, strict=True)
    ):
        first = 0
        records = iter(result.records)
        for work in plan.works:
            record = next(records)
            if not work.sample:
                continue
            # A speculative lane has a row per draft it verified, history or proposed, plus one.
            count = 1 + record.drafts_offered if work.speculation is not None else 1
            for position in range(len(record.tokens)):
                rows[(step, record.slot, position)] = logits[first + position]
            first += count
    return rows


@pytest.fixture(scope="module")
def greedy_runs(tiny_model_dir):
    engine, _ = spied_engine(tiny_model_dir, None)
    vocab = engine.vocab_size
    requests = [
        EngineRequest(f"p{i}", prompt, GREEDY, logprobs=LogprobAsk(wanted=True, count=20))
        for i, prompt in enumerate(prompts(vocab))
    ]
    return (*run_both(tiny_model_dir, requests, max_num_seqs=8), vocab)


def test_greedy_tokens_are_identical_with_drafts_offered_and_accepted(greedy_runs):
    plain, speculative, capture, _ = greedy_runs

    for name, items in plain.items():
        assert tokens(speculative[name]) == tokens(items), name
    verified = capture.records(Role.SPECULATIVE)
    assert sum(r.drafts_offered for r in verified) > 50
    assert sum(r.drafts_accepted for r in verified) > 20
    assert any(len(r.tokens) > 2 for r in verified)


def test_every_reported_value_is_the_verifier_s_row_in_float64_within_fp32_rounding(greedy_runs):
    _, speculative, capture, vocab = greedy_runs
    rows = target_rows(capture)
    checked = 0

    for step, (plan, result) in enumerate(zip(capture.plans, capture.results, strict=True)):
        for lane, (work, record) in enumerate(zip(plan.works, result.records, strict=True)):
            payload = result.lane_logprobs(lane)
            if payload is None or work.speculation is None:
                continue
            for position, entry in enumerate(payload):
                row = rows[(step, record.slot, position)][:vocab].double()
                expected = torch.log_softmax(row, dim=0)
                value = expected[entry.chosen.token_id].item()
                assert abs(entry.chosen.logprob - value) <= FP32_ROUNDING * (1 + abs(value))
                best = torch.argsort(expected, descending=True, stable=True)[:20].tolist()
                assert [a.token_id for a in entry.alternatives][:5] == best[:5]
                checked += 1
    assert checked > 100


def test_values_differ_from_speculation_off_by_at_most_1e_5_with_near_ties_named(greedy_runs):
    plain, speculative, _, _ = greedy_runs
    swaps = 0

    for name, items in plain.items():
        off, on = entries(items), entries(speculative[name])
        assert len(off) == len(on) > 0
        for a, b in zip(off, on, strict=True):
            assert a.chosen.token_id == b.chosen.token_id
            assert abs(a.chosen.logprob - b.chosen.logprob) <= 1e-5
            ids_a = [t.token_id for t in a.alternatives]
            ids_b = [t.token_id for t in b.alternatives]
            if ids_a != ids_b:
                # A swap is allowed only between values closer than the 1e-5 shape noise.
                swaps += 1
                values = {t.token_id: t.logprob for t in a.alternatives}
                for x, y in zip(ids_a, ids_b, strict=True):
                    if x != y and y in values:
                        assert abs(values[x] - values[y]) <= 1e-5
    assert swaps <= len(plain)  # near-ties are rare; a systematic difference would be everywhere


def test_a_seed_gives_one_output_whatever_the_batch_around_it(tiny_model_dir):
    engine, _ = spied_engine(tiny_model_dir, NGRAM)
    vocab = engine.vocab_size
    sampled = SamplingParams(temperature=0.9, top_k=40, max_tokens=30, seed=17, ignore_eos=True)
    prompt = repetitive_prompt(3, vocab)
    alone = tokens(drain(engine, [EngineRequest("alone", prompt, sampled)])["alone"])

    crowd = [EngineRequest("seeded", prompt, sampled)] + [
        EngineRequest(f"other{i}", repetitive_prompt(40 + i, vocab), sampled) for i in range(5)
    ]
    engine, capture = spied_engine(tiny_model_dir, NGRAM)
    together = tokens(drain(engine, crowd)["seeded"])

    assert together == alone
    assert sum(r.drafts_accepted for r in capture.records(Role.SPECULATIVE)) > 0


DRAWS = 1500
# Prompt a b a, with a and b pushed up: whichever comes first, the history then proposes a
# (what followed the suffix before), which the biased target keeps a good part of the time.
A, B = 10, 20
BIAS = ((A, 11.5), (B, 12.0))


def sampled_runs(model_dir: Path, speculative, seeds: range) -> tuple[list[list[int]], Capture]:
    engine, capture = spied_engine(model_dir, speculative, max_num_seqs=16, budget=1024)
    params = dict(temperature=1.0, max_tokens=4, ignore_eos=True, logit_bias=BIAS)
    requests = [
        EngineRequest(f"s{seed}", (A, B, A), SamplingParams(seed=seed, **params)) for seed in seeds
    ]
    found: dict[str, list] = {}
    for start in range(0, len(requests), 500):  # within the engine's admission queue
        found.update(drain(engine, requests[start : start + 500]))
    return [tokens(found[f"s{seed}"]) for seed in seeds], capture


def acceptance(capture: Capture, vocab: int) -> tuple[int, float, float]:
    """Rounds whose first draft stood, and the expected count and variance from the biased
    target distribution of each round's first row: sum p(d) and sum p(d)(1 - p(d))."""
    kept, expected, variance = 0, 0.0, 0.0
    bias = torch.zeros(vocab, dtype=torch.float64)
    for token_id, value in BIAS:
        bias[token_id] = value
    for plan, logits, result in zip(capture.plans, capture.logits, capture.results, strict=True):
        first = 0
        for work, record in zip(plan.works, result.records, strict=True):
            if not work.sample:
                continue
            if record.drafts_offered:
                row = logits[first][:vocab].double() + bias
                p = torch.softmax(row, dim=0)[work.drafts[0]].item()
                kept += record.drafts_accepted > 0
                expected += p
                variance += p * (1 - p)
            first += 1 + record.drafts_offered if work.speculation is not None else 1
    return kept, expected, variance


def test_sampled_tokens_after_verification_follow_the_plain_distribution(tiny_model_dir):
    from scipy.stats import chi2_contingency

    plain, _ = sampled_runs(tiny_model_dir, None, range(DRAWS))
    speculative, capture = sampled_runs(tiny_model_dir, NGRAM, range(DRAWS, 2 * DRAWS))

    vocab = spied_engine(tiny_model_dir, None)[0].vocab_size
    kept, expected, variance = acceptance(capture, vocab)
    assert expected > 100, "the drafts were not likely enough to test acceptance"
    # Drafts stand with probability p(d): a count far off the binomial sum would show a bias.
    assert abs(kept - expected) < 4 * variance**0.5, (kept, expected)
    for position in (1, 2, 3):
        seen = sorted({t[position] for t in plain} | {t[position] for t in speculative})
        table = [[sum(t[position] == s for t in run) for s in seen] for run in (plain, speculative)]
        common = [i for i in range(len(seen)) if table[0][i] + table[1][i] >= 20]
        pooled = [
            [row[i] for i in common] + [sum(row) - sum(row[i] for i in common)] for row in table
        ]
        pooled = [row for row in zip(*pooled, strict=True) if sum(row)]
        _, p_value, _, _ = chi2_contingency(list(zip(*pooled, strict=True)))
        assert p_value > 1e-3, (position, pooled)


@pytest.fixture(scope="module")
def drafts(tiny_model_dir, tmp_path_factory) -> dict[str, Path]:
    from tests.support.tiny_serving import build_draft_model_dir

    root = tmp_path_factory.mktemp("drafts")
    return {
        "same": build_draft_model_dir(root / "same", tiny_model_dir, noise=0.0),
        "near": build_draft_model_dir(root / "near", tiny_model_dir, noise=0.02),
    }


def draft_config(path: Path) -> SpeculativeConfig:
    return SpeculativeConfig(SpeculativeMethod.DRAFT_MODEL, 4, model=str(path))


def test_a_draft_model_identical_to_the_target_has_every_draft_accepted(tiny_model_dir, drafts):
    engine, capture = spied_engine(tiny_model_dir, draft_config(drafts["same"]))
    requests = [
        EngineRequest(f"p{i}", prompt, GREEDY)
        for i, prompt in enumerate(prompts(engine.vocab_size))
    ]

    drain(engine, requests)

    verified = [r for r in capture.records(Role.SPECULATIVE) if r.drafts_offered]
    # Every draft stands only if the draft cache was kept exactly in step with acceptance.
    assert len(verified) > 50
    assert all(r.drafts_accepted == r.drafts_offered for r in verified)


def test_a_near_draft_model_changes_no_greedy_token_and_reports_target_values(
    tiny_model_dir, drafts
):
    plain_engine, _ = spied_engine(tiny_model_dir, None)
    vocab = plain_engine.vocab_size
    requests = [
        EngineRequest(f"p{i}", prompt, GREEDY, logprobs=LogprobAsk(wanted=True, count=5))
        for i, prompt in enumerate(prompts(vocab))
    ]
    plain = drain(plain_engine, requests)
    engine, capture = spied_engine(tiny_model_dir, draft_config(drafts["near"]))

    speculative = drain(engine, requests)

    verified = capture.records(Role.SPECULATIVE)
    assert 0 < sum(r.drafts_accepted for r in verified) < sum(r.drafts_offered for r in verified)
    rows = target_rows(capture)
    for name, items in plain.items():
        assert tokens(speculative[name]) == tokens(items), name
        for a, b in zip(entries(items), entries(speculative[name]), strict=True):
            assert abs(a.chosen.logprob - b.chosen.logprob) <= 1e-5
    for step, (plan, result) in enumerate(zip(capture.plans, capture.results, strict=True)):
        for lane, (work, record) in enumerate(zip(plan.works, result.records, strict=True)):
            payload = result.lane_logprobs(lane)
            if payload is None or work.speculation is None:
                continue
            for position, entry in enumerate(payload):
                row = torch.log_softmax(rows[(step, record.slot, position)][:vocab].double(), 0)
                value = row[entry.chosen.token_id].item()
                assert abs(entry.chosen.logprob - value) <= FP32_ROUNDING * (1 + abs(value))


def test_sampled_tokens_with_a_draft_model_follow_the_plain_distribution(tiny_model_dir, drafts):
    from scipy.stats import chi2_contingency

    plain, _ = sampled_runs(tiny_model_dir, None, range(DRAWS))
    speculative, capture = sampled_runs(
        tiny_model_dir, draft_config(drafts["near"]), range(DRAWS, 2 * DRAWS)
    )

    verified = capture.records(Role.SPECULATIVE)
    assert sum(r.drafts_accepted for r in verified) > DRAWS // 2
    assert sum(r.drafts_offered - r.drafts_accepted for r in verified) > 50
    for position in (1, 2, 3):
        seen = sorted({t[position] for t in plain} | {t[position] for t in speculative})
        table = [[sum(t[position] == s for t in run) for s in seen] for run in (plain, speculative)]
        common = [i for i in range(len(seen)) if table[0][i] + table[1][i] >= 20]
        pooled = [
            [row[i] for i in common] + [sum(row) - sum(row[i] for i in common)] for row in table
        ]
        pooled = [row for row in zip(*pooled, strict=True) if sum(row)]
        _, p_value, _, _ = chi2_contingency(list(zip(*pooled, strict=True)))
        assert p_value > 1e-3, (position, pooled)


def test_a_draft_model_with_another_vocabulary_is_refused_at_load(tiny_model_dir, tmp_path):
    from adapters.cli import bootstrap
    from adapters.gpu.factory import RunnerSettings
    from domain.engine.engine import EngineConfig
    from tests.support.tiny_serving import build_tiny_model_dir

    other = build_tiny_model_dir(tmp_path / "other", byte_fallback=True)
    speculative = draft_config(other)

    with pytest.raises(ValueError, match="does not share the target's vocabulary"):
        bootstrap.load(
            str(tiny_model_dir),
            RunnerSettings(device="cpu", max_model_len=128, kv_cache_bytes=4 << 20),
            EngineConfig(speculative=speculative),
        )


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_preemption_in_the_middle_of_speculation_loses_and_duplicates_nothing(
    tiny_model_dir, drafts, method
):
    speculative = NGRAM if method == "ngram" else draft_config(drafts["near"])
    engine, _ = spied_engine(tiny_model_dir, None)
    requests = [
        EngineRequest(f"p{i}", prompt, GREEDY, logprobs=LogprobAsk(wanted=True, count=2))
        for i, prompt in enumerate(prompts(engine.vocab_size)[:8])
    ]
    roomy, _ = spied_engine(tiny_model_dir, None)
    expected = drain(roomy, requests)

    # 48 blocks of 4 positions (512 bytes each per model) hold fewer than eight sequences of
    # about 65 positions: some must be preempted.
    models = 1 if method == "ngram" else 2
    tight, capture = spied_engine(
        tiny_model_dir, speculative, kv_bytes=48 * 4 * 512 * models, max_model_len=96
    )
    found = drain(tight, requests)

    restarts = [w for plan in capture.plans for w in plan.works if w.start_position == 0]
    assert len(restarts) > len(requests), "the pool never forced a re-prefill"
    assert sum(r.drafts_accepted for r in capture.records(Role.SPECULATIVE)) > 0
    for name, items in expected.items():
        assert tokens(found[name]) == tokens(items), name
        assert [e.chosen.token_id for e in entries(found[name])] == [
            e.chosen.token_id for e in entries(items)
        ]
