"""Constrained generation on the torch executor: only allowed tokens, raw entries, speculation
and preemption under a grammar."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.gpu.model.config import ModelConfig
from adapters.gpu.model.kv_cache import PagedKVCache
from adapters.grammar.llguidance_compiler import LlguidanceCompiler
from adapters.tokenizer.hf import HfTokenizer
from domain.contract.records import Role
from domain.logprobs.rules import LogprobAsk
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams
from domain.structured.grammar import GrammarKind, GrammarSpec
from tests.fakes import RecordingObserver
from tests.integration.engine.test_speculative_engine import (
    FP32_ROUNDING,
    NGRAM,
    Capture,
    spied_engine,
    target_rows,
    tokens,
)
from tests.support.draining import drain
from tests.support.engines import build_engine

pytestmark = pytest.mark.model

WORDS = ("the", "quick", "brown", "fox", "slot", "answer", "a", "new")
LOGPROBS = LogprobAsk(wanted=True, count=5)


def regexes() -> st.SearchStrategy[str]:
    """Small regular expressions over the tiny tokenizer's corpus: words, classes, repeats."""
    atom = st.sampled_from([*WORDS, "[a-f]", "[0-9]", "[a-z]{1,3}", " ", "(x|yz)"])
    repeated = st.tuples(atom, st.sampled_from(["", "?", "{1,3}", "{2}"])).map(
        lambda pair: f"({pair[0]}){pair[1]}" if pair[1] else pair[0]
    )
    return st.lists(repeated, min_size=1, max_size=5).map("".join)


def specs() -> st.SearchStrategy[GrammarSpec]:
    choices = st.lists(
        st.lists(st.sampled_from(WORDS), min_size=1, max_size=3).map(" ".join),
        min_size=1,
        max_size=4,
        unique=True,
    )
    return st.one_of(
        regexes().map(lambda r: GrammarSpec(GrammarKind.REGEX, r)),
        choices.map(lambda c: GrammarSpec(GrammarKind.CHOICE, json.dumps(c))),
    )


def check_allowed(compiler: LlguidanceCompiler, spec: GrammarSpec, output: list[int]) -> None:
    """Walks a fresh matcher over the output: every token was allowed where it was sampled."""
    matcher = compiler.compile(spec).matcher()
    for position, token_id in enumerate(output):
        assert token_id in matcher.allowed_token_ids(), (spec, output, position)
        assert matcher.accept([token_id])


def check_raw(capture: Capture, vocab: int) -> int:
    """Every reported value is float64 log_softmax of the unmasked row that sampled it."""
    rows = target_rows(capture)
    checked = 0
    for step, (plan, result) in enumerate(zip(capture.plans, capture.results, strict=True)):
        for lane, record in enumerate(result.records):
            payload = result.lane_logprobs(lane)
            if payload is None or not plan.works[lane].sample:
                continue
            for position, entry in enumerate(payload):
                row = torch.log_softmax(rows[(step, record.slot, position)][:vocab].double(), 0)
                value = row[entry.chosen.token_id].item()
                assert abs(entry.chosen.logprob - value) <= FP32_ROUNDING * (1 + abs(value))
                top = [a.logprob for a in entry.alternatives][:3]
                assert top == pytest.approx(row.topk(3).values.tolist(), abs=1e-5)
                checked += 1
    return checked


@pytest.fixture(scope="module")
def compiler(tiny_model_dir: Path) -> LlguidanceCompiler:
    return LlguidanceCompiler(HfTokenizer.from_dir(tiny_model_dir))


@settings(max_examples=12, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    spec=specs(),
    temperature=st.sampled_from([0.0, 0.7, 1.5]),
    top_k=st.sampled_from([0, 5]),
    speculative=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_random_grammars_sample_only_allowed_tokens_and_report_raw_values(
    tiny_model_dir, compiler, spec, temperature, top_k, speculative, seed
):
    engine, capture = spied_engine(tiny_model_dir, NGRAM if speculative else None)
    tokenizer = HfTokenizer.from_dir(tiny_model_dir)
    prompt = tuple(tokenizer.encode("the quick brown fox", add_special_tokens=False))
    params = SamplingParams(temperature=temperature, top_k=top_k, seed=seed, max_tokens=24)
    requests = [
        EngineRequest(f"r{i}", prompt[i:], params, n=2, logprobs=LOGPROBS, grammar=spec)
        for i in range(2)
    ]

    found = drain(engine, requests)

    for items in found.values():
        for choice in (0, 1):
            output = [t for i in items if getattr(i, "index", None) == choice for t in i.token_ids]
            check_allowed(compiler, spec, output)
    assert check_raw(capture, engine.vocab_size) > 0


def test_speculation_under_a_grammar_keeps_greedy_outputs_and_checks_drafts(tiny_model_dir):
    # The choices repeat phrases, so history drafts come up and the grammar decides on them.
    words = ["the quick the quick the quick brown", "the quick the quick fox fox fox fox"]
    spec = GrammarSpec(GrammarKind.CHOICE, json.dumps(words))
    greedy = SamplingParams(temperature=0.0, max_tokens=40)
    plain_engine, _ = spied_engine(tiny_model_dir, None)
    tokenizer = HfTokenizer.from_dir(tiny_model_dir)
    prompt = tuple(tokenizer.encode("the quick the quick", add_special_tokens=False))
    requests = [
        EngineRequest(f"r{i}", prompt[i:], greedy, logprobs=LOGPROBS, grammar=spec)
        for i in range(3)
    ]
    plain = drain(plain_engine, requests)

    engine, capture = spied_engine(tiny_model_dir, NGRAM)
    speculative = drain(engine, requests)

    for name, items in plain.items():
        assert tokens(speculative[name]) == tokens(items)
    verified = capture.records(Role.SPECULATIVE)
    assert sum(r.drafts_accepted for r in verified) > 5
    assert check_raw(capture, engine.vocab_size) > 0


def test_preempted_constrained_lanes_resume_their_grammar(tiny_model_dir):
    config = ModelConfig.from_dir(tiny_model_dir)
    block_bytes = PagedKVCache.bytes_per_block(config, 4, torch.float32)
    spec = GrammarSpec(GrammarKind.REGEX, "([a-f][0-9] ){3,12}(slot|fox)")
    params = [SamplingParams(temperature=0.8, seed=i, max_tokens=40) for i in range(8)]
    roomy, tokenizer, _ = build_engine(tiny_model_dir, max_model_len=96)
    prompt = tuple(tokenizer.encode("the quick brown fox", add_special_tokens=False))
    requests = [
        EngineRequest(f"r{i}", prompt, p, logprobs=LOGPROBS, grammar=spec)
        for i, p in enumerate(params)
    ]
    expected = {name: tokens(items) for name, items in drain(roomy, requests).items()}

    steps = RecordingObserver()
    tight, _, _ = build_engine(
        tiny_model_dir, kv_bytes=block_bytes * 30, max_model_len=96, budget=64, observer=steps
    )
    found = {name: tokens(items) for name, items in drain(tight, requests).items()}

    assert steps.total("preemptions") > 0
    assert found == expected
