"""A failure inside one lane (a grammar that breaks mid-output) fails that request only."""

from __future__ import annotations

import json

from domain.emission.outputs import ChoiceDelta, RequestEnd
from domain.engine.engine import Engine, EngineConfig
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams
from domain.structured.grammar import GrammarKind, GrammarSpec
from domain.telemetry.step_stats import SchedulerState
from tests.fakes import FakeExecutor, FakeGrammarCompiler, FakeTokenizer, RecordingObserver
from tests.support.draining import drain
from tests.support.geometry import fake_geometry

GEOMETRY = fake_geometry(block_size=2, num_blocks=96)
# The fake grammar breaks after this many tokens: a choice of 12 letters passes admission and
# fails mid-output, as an llguidance grammar that outgrows a row limit does.
ROW_LIMIT = 4
BREAKING = GrammarSpec(GrammarKind.CHOICE, json.dumps(["abcdefghijkl"]), "response_format")


def engine(
    row_limit: int | None = ROW_LIMIT, observer: RecordingObserver | None = None
) -> tuple[Engine, FakeExecutor]:
    compiler = FakeGrammarCompiler(row_limit)
    executor = FakeExecutor(GEOMETRY, grammars=compiler)
    config = EngineConfig(max_num_batched_tokens=64)
    return Engine(executor, FakeTokenizer(), config, grammars=compiler, observer=observer), executor


def innocents() -> list[EngineRequest]:
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    return [
        EngineRequest(f"innocent{i}", (3 + i, 9, 14, 27, 5), params, n=1 + i % 2) for i in range(4)
    ]


def breaking(name: str = "bad") -> EngineRequest:
    params = SamplingParams(temperature=0.0, max_tokens=20)
    return EngineRequest(name, (8, 2, 33), params, n=2, grammar=BREAKING)


def tokens(items: list) -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for item in items:
        if isinstance(item, ChoiceDelta):
            found.setdefault(item.index, []).extend(item.token_ids)
    return found


def test_a_grammar_that_breaks_mid_output_fails_only_its_own_request():
    alone = drain(engine()[0], innocents())
    served, executor = engine()

    found = drain(served, [breaking(), *innocents()], failing={"bad"})

    for name, items in alone.items():
        assert tokens(found[name]) == tokens(items), name
        assert all(not isinstance(item, RequestEnd) or item.error is None for item in found[name])
    end = found["bad"][-1]
    assert end.error_param == "response_format"
    assert "output constraint" in end.error
    # It broke after ROW_LIMIT tokens, in steps its innocent neighbours shared.
    assert sum(len(t) for t in tokens(found["bad"]).values()) <= 2 * ROW_LIMIT
    constrained = [p for p in executor.plans if any(w.grammar for w in p.works)]
    assert all(len(p.works) > 2 for p in constrained)


def test_each_failing_request_gets_its_own_error_and_nobody_else_gets_one():
    served, _ = engine()
    other = GrammarSpec(GrammarKind.CHOICE, json.dumps(["mnopqrstuvw"]), "structured_outputs")
    second = EngineRequest("bad1", (8, 2, 34), SamplingParams(temperature=0.0), grammar=other)

    found = drain(served, [breaking("bad0"), *innocents(), second], failing={"bad0", "bad1"})

    ends = {name: items[-1] for name, items in found.items()}
    assert ends["bad0"].error_param == "response_format"
    assert ends["bad1"].error_param == "structured_outputs"
    for name, items in found.items():
        if name.startswith("innocent"):
            deltas = items[:-1]
            assert all(isinstance(i, ChoiceDelta) and i.finish_reason != "error" for i in deltas)
            assert ends[name].error is None and ends[name].error_param is None


def test_the_engine_keeps_serving_after_a_lane_failure_and_frees_its_slots():
    steps = RecordingObserver()
    served, _ = engine(observer=steps)

    drain(served, [breaking()], failing={"bad"})
    again = drain(served, innocents())

    assert steps.state == SchedulerState()
    assert tokens(again["innocent0"])[0]
