"""The overlapped engine loop (async scheduling) over the fake executor: what every request
receives equals what the synchronous loop gives it, with stops, aborts, preemption, n > 1 and
each feature; steps are planned ahead where the choices allow and synchronously where not."""

from __future__ import annotations

import json

import pytest

from domain.contract.capabilities import LogprobCapability
from domain.engine.engine import Engine, EngineConfig
from domain.logprobs.rules import LogprobAsk
from domain.overlap.pending import PENDING_TOKEN
from domain.reasoning.thinking import ThinkingBudget, ThinkingMarkers
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams
from domain.speculation.drafts import SpeculativeConfig, SpeculativeMethod
from domain.structured.grammar import GrammarKind, GrammarSpec
from tests.fakes import (
    FAKE_EOS,
    FakeExecutor,
    FakeGrammarCompiler,
    FakeTokenizer,
    RecordingObserver,
)
from tests.support.draining import channel_items, drain, step_until_idle, whole_outputs
from tests.support.geometry import fake_geometry

SCORING = LogprobCapability(top_k=20, selects_ids=True, scored_capacities=(32,))
NGRAM = SpeculativeConfig(SpeculativeMethod.NGRAM, 4, 2, 3)


def make_engine(
    overlapped: bool,
    *,
    num_blocks: int = 64,
    capacity: int = 8,
    budget: int = 32,
    eos_after: int | None = None,
    speculative: SpeculativeConfig | None = None,
    observer: RecordingObserver | None = None,
) -> tuple[Engine, FakeExecutor]:
    geometry = fake_geometry(
        logprobs=SCORING, capacity=capacity, block_size=4, num_blocks=num_blocks, max_model_len=64
    )
    compiler = FakeGrammarCompiler()
    executor = FakeExecutor(geometry, eos_after=eos_after, grammars=compiler)
    config = EngineConfig(
        max_num_batched_tokens=budget, speculative=speculative, async_scheduling=overlapped
    )
    engine = Engine(executor, FakeTokenizer(), config, grammars=compiler, observer=observer)
    return engine, executor


def request(rid: str, prompt_len: int, max_tokens: int, **fields) -> EngineRequest:
    prompt = tuple(1 + (i * 7 + len(rid) * 3) % 60 for i in range(prompt_len))
    params = fields.pop("params", {})
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, **params)
    return EngineRequest(rid, prompt, sampling, **fields)


def both(requests: list[EngineRequest], failing=(), **engine_fields) -> tuple[dict, FakeExecutor]:
    """Each request's outputs, equal under both loops, and the overlapped run's executor."""
    synchronous, _ = make_engine(False, **engine_fields)
    overlapped, executor = make_engine(True, **engine_fields)
    expected = {
        rid: whole_outputs(items) for rid, items in drain(synchronous, requests, failing).items()
    }
    found = {
        rid: whole_outputs(items) for rid, items in drain(overlapped, requests, failing).items()
    }
    assert found == expected
    return found, executor


def planned_ahead(executor: FakeExecutor) -> int:
    return sum(PENDING_TOKEN in work.token_ids for plan in executor.plans for work in plan.works)


def test_plain_requests_are_planned_ahead_and_get_what_the_synchronous_loop_gives():
    requests = [request(f"r{i}", 3 + 5 * i, 4 + 3 * i) for i in range(6)]

    _, executor = both(requests, budget=16)

    # Every decode lane after the first is planned before its token is read.
    assert planned_ahead(executor) >= sum(4 + 3 * i - 2 for i in range(6))


def test_stop_tokens_eos_and_stop_strings_end_requests_with_no_token_after_them():
    unstopped = drain(make_engine(False)[0], [request("stop_id", 5, 30)])["stop_id"]
    third = whole_outputs(unstopped)[0][0][1].token_ids[2]
    unstopped = drain(make_engine(False)[0], [request("stop_text", 6, 30)])["stop_text"]
    letter = whole_outputs(unstopped)[0][0][1].text[3]
    requests = [
        request("stop_id", 5, 30, params={"stop_token_ids": (third,)}),
        request("eos", 7, 30),
        request("stop_text", 6, 30, params={"stop": (letter,)}),
        request("length", 4, 5),
    ]

    found, _ = both(requests, eos_after=6)

    ends = {rid: found[rid][0][0][1] for rid in found}
    assert ends["stop_id"].token_ids[-1] == third and len(ends["stop_id"].token_ids) <= 3
    assert ends["eos"].token_ids[-1] == FAKE_EOS and ends["eos"].finish_reason == "stop"
    assert ends["stop_text"].stop_reason == letter and letter not in ends["stop_text"].text
    assert ends["length"].finish_reason == "length"


def test_several_choices_logprobs_and_selected_ids_match():
    logprobs = LogprobAsk(wanted=True, count=3, token_ids=(1, 5))
    requests = [
        request("n3", 6, 12, n=3, logprobs=logprobs),
        request("seeded", 9, 10, n=2, params={"seed": 7}, logprobs=logprobs),
    ]

    found, executor = both(requests)

    assert len(found["n3"][0]) == 3 and planned_ahead(executor) > 0


def test_preemption_under_a_small_kv_pool_changes_no_output():
    requests = [request(f"p{i}", 6 + i, 14) for i in range(5)]
    observer = RecordingObserver()

    _, executor = both(requests, num_blocks=16, budget=24, observer=observer)

    assert planned_ahead(executor) > 0
    assert observer.total("preemptions") > 0


def test_an_abort_stops_a_request_within_one_token_and_never_reaches_the_others():
    engine, _ = make_engine(True)
    kept = [request(f"k{i}", 5 + i, 12) for i in range(3)]
    doomed = request("doomed", 8, 40)
    channels = {r.request_id: engine.submit(r) for r in [*kept, doomed]}
    for _ in range(6):
        engine.step()
    engine.abort("doomed")
    step_until_idle(engine)

    alone = {rid: whole_outputs(items) for rid, items in drain(make_engine(False)[0], kept).items()}
    for rid in alone:
        assert whole_outputs(channel_items(channels[rid])) == alone[rid]
    (doomed_items,) = [channel_items(channels["doomed"])]
    cut = whole_outputs(doomed_items)[0][0][1]
    whole = whole_outputs(drain(make_engine(False)[0], [doomed])["doomed"])[0][0][1]
    assert cut.finish_reason == "abort" and 0 < len(cut.token_ids) < 40
    assert cut.token_ids == whole.token_ids[: len(cut.token_ids)]


def test_speculation_grammars_thinking_budgets_and_scored_prompts_run_synchronously():
    markers = ThinkingMarkers((60,), (61, 62))
    grammar = GrammarSpec(GrammarKind.CHOICE, json.dumps(["cab", "dog", "bead"]))
    plain = request("plain", 5, 12)
    featured = [
        request("grammar", 5, 12, grammar=grammar),
        request("thinking", 5, 12, thinking=ThinkingBudget(3, markers, True)),
        request("scored", 9, 6, logprobs=LogprobAsk(prompt_logprobs=2)),
    ]

    for feature in featured:
        _, executor = both([plain, feature])
        # No step planned ahead while the featured choice runs: its part needs each token.
        running = [p for p in executor.plans if any(w.slot == 1 for w in p.works)]
        assert running and all(PENDING_TOKEN not in w.token_ids for p in running for w in p.works)

    _, executor = both([plain, request("copying", 8, 20)], speculative=NGRAM)
    assert planned_ahead(executor) == 0


def test_a_step_that_fails_fails_its_requests_only_and_the_loop_goes_on():
    engine, executor = make_engine(True)
    original = executor.submit
    calls = []

    def failing_once(plan):
        calls.append(plan)
        if len(calls) == 4:
            raise RuntimeError("device lost")
        return original(plan)

    executor.submit = failing_once
    first = [request(f"f{i}", 4, 10) for i in range(2)]
    outputs = drain(engine, first, failing={"f0", "f1"})
    assert all("device lost" in outputs[r.request_id][-1].error for r in first)

    later = request("later", 6, 8)
    assert whole_outputs(drain(engine, [later])["later"]) == whole_outputs(
        drain(make_engine(False)[0], [later])["later"]
    )


@pytest.mark.parametrize("eos_after", [1, 3])
def test_a_request_that_ends_at_its_first_tokens_wastes_at_most_one_lane(eos_after):
    requests = [request("short", 5, 20), request("other", 6, 20)]

    found, executor = both(requests, eos_after=eos_after)

    assert found["short"][0][0][1].token_ids[-1] == FAKE_EOS
    # One lane at most ran past each end, its token never emitted.
    lanes = sum(len(plan.works) for plan in executor.plans)
    synchronous, sync_executor = make_engine(False, eos_after=eos_after)
    drain(synchronous, requests)
    assert lanes - sum(len(plan.works) for plan in sync_executor.plans) <= len(requests)


def test_a_step_that_raises_while_planning_ahead_leaves_its_predecessor_in_flight_to_land():
    engine, _ = make_engine(True)
    requests = [request(f"w{i}", 5 + i, 10) for i in range(3)]
    channels = {r.request_id: engine.submit(r) for r in requests}
    engine.step()  # the first step is now in flight
    scheduler = engine._scheduler  # fault injection: the planner itself raises once
    planned = scheduler.schedule

    def failing_once(ahead=False):
        scheduler.schedule = planned
        raise RuntimeError("planner bug")

    scheduler.schedule = failing_once
    with pytest.raises(RuntimeError, match="planner bug"):
        engine.step()
    step_until_idle(engine)

    alone = drain(make_engine(False)[0], requests)
    for rid, channel in channels.items():
        assert whole_outputs(channel_items(channel)) == whole_outputs(alone[rid])
