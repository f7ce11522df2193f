"""The thinking budget on the torch executor: a two-token end forced at the budget, unchanged
by history speculation and by preemption, with forced records marked and left unreduced.

The markers are ordinary tokens of the tiny model; logit_bias keeps the model from sampling
them, so every end token in an output was forced.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from domain.contract.records import CompletionRecord
from domain.emission.outputs import ChoiceDelta
from domain.engine.engine import Engine, EngineConfig
from domain.logprobs.rules import LogprobAsk
from domain.reasoning.thinking import ThinkingBudget, ThinkingMarkers
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams
from domain.speculation.drafts import SpeculativeConfig, SpeculativeMethod
from domain.structured.grammar import GrammarKind, GrammarSpec
from tests.fakes import RecordingObserver
from tests.support.draining import drain
from tests.support.engines import build_engine

pytestmark = pytest.mark.model

START, END = 40, (41, 42)
MARKERS = ThinkingMarkers((START,), END)
NGRAM = SpeculativeConfig(SpeculativeMethod.NGRAM, 4, 1, 3)
PARAMS = SamplingParams(
    temperature=0.0,
    max_tokens=24,
    ignore_eos=True,
    logit_bias=((START, -100.0), (END[0], -100.0), (END[1], -100.0)),
)


def requests(budgets: list[int], *, logprobs: bool = False) -> list[EngineRequest]:
    return [
        EngineRequest(
            f"r{index}",
            (7 + index, 50, 60, 70, 50, 60, 70, START),
            PARAMS,
            logprobs=LogprobAsk(wanted=True, count=1) if logprobs else LogprobAsk(),
            thinking=ThinkingBudget(budget, MARKERS),
        )
        for index, budget in enumerate(budgets)
    ]


def tokens(items: list) -> list[int]:
    return [t for item in items if isinstance(item, ChoiceDelta) for t in item.token_ids]


def recorded(engine) -> list[CompletionRecord]:
    """Every record the engine's executor returns, from now on."""
    executor = engine._executor  # noqa: SLF001 - the test watches the executor's records
    read, records = executor.read, []

    def spy(frame):
        result = read(frame)
        records.extend(result.records)
        return result

    executor.read = spy
    return records


def test_the_end_is_forced_at_the_budget_with_or_without_speculation(tiny_model_dir: Path):
    budgets = [0, 3, 9]
    plain, _, _ = build_engine(tiny_model_dir)
    speculating, _, plans = build_engine(tiny_model_dir, speculative=NGRAM)
    records = recorded(speculating)

    expected = drain(plain, requests(budgets))
    found = drain(speculating, requests(budgets))

    for index, budget in enumerate(budgets):
        out = tokens(found[f"r{index}"])
        assert out == tokens(expected[f"r{index}"])
        assert out[budget : budget + 2] == list(END)
        assert END[0] not in out[:budget] and END[0] not in out[budget + 2 :]
    forced = [r for r in records if r.forced_mask]
    assert sorted(r.tokens for r in forced) == sorted([(END[0],), (END[1],)] * len(budgets))
    lanes = [work for plan in plans for work in plan.works if work.sample]
    assert any(work.drafts for work in lanes), "drafts were offered"
    assert all(work.speculation is None for work in lanes if work.forced_token is not None)


def test_forced_tokens_get_no_entries_and_preemption_changes_nothing(tiny_model_dir: Path):
    budgets = [2, 4, 6, 8]
    roomy, _, _ = build_engine(tiny_model_dir)
    steps = RecordingObserver()
    tight, _, _ = build_engine(
        tiny_model_dir, kv_bytes=22 * 4 * 512, max_model_len=40, observer=steps
    )

    expected = drain(roomy, requests(budgets, logprobs=True))
    found = drain(tight, requests(budgets, logprobs=True))

    assert steps.total("preemptions") > 0
    for index, budget in enumerate(budgets):
        items = found[f"r{index}"]
        out = tokens(items)
        assert out == tokens(expected[f"r{index}"])
        entries = [e for item in items if isinstance(item, ChoiceDelta) for e in item.logprobs]
        sampled = out[:budget] + out[budget + 2 :]
        assert [e.position.chosen.token_id for e in entries] == sampled
        assert items[-1].usage.completion_tokens == len(out) == 24


GRAMMAR_WORDS = ["the quick brown", "fox over the dog"]


def grammar_requests(budgets: list[int]) -> list[EngineRequest]:
    """Choices whose output the reasoning parser reads as beginning inside the block the
    prompt opened: the budget's forced end closes it, then the choice grammar takes over."""
    spec = GrammarSpec(GrammarKind.CHOICE, json.dumps(GRAMMAR_WORDS))
    params = dataclasses.replace(PARAMS, max_tokens=40)
    return [
        EngineRequest(
            f"g{index}",
            (7 + index, 50, 60, 70, 50, 60, 70, START),
            params,
            grammar=spec,
            thinking=ThinkingBudget(budget, MARKERS, opened=True),
        )
        for index, budget in enumerate(budgets)
    ]


def test_the_grammar_starts_after_the_forced_end_on_the_torch_executor(tiny_model_dir: Path):
    budgets = [0, 3, 9]
    plain, tokenizer, _ = build_engine(tiny_model_dir)
    speculating, _, plans = build_engine(tiny_model_dir, speculative=NGRAM)

    expected = drain(plain, grammar_requests(budgets))
    found = drain(speculating, grammar_requests(budgets))
    # Another engine over the same executor: its slots and epochs meet the stale matchers.
    again = Engine(plain._executor, tokenizer, EngineConfig(), grammars=plain._grammars)  # noqa: SLF001
    repeated = drain(again, grammar_requests(budgets))

    for index, budget in enumerate(budgets):
        out = tokens(expected[f"g{index}"])
        assert out == tokens(found[f"g{index}"]) == tokens(repeated[f"g{index}"])
        assert out[budget : budget + 2] == list(END)
        answer = tokenizer.decode(out[budget + 2 :], skip_special_tokens=True)
        assert answer in GRAMMAR_WORDS, out
    lanes = [work for plan in plans for work in plan.works if work.sample]
    assert all(not work.drafts for work in lanes if work.grammar is None)
    assert any(work.grammar is not None and work.grammar.start for work in lanes)
