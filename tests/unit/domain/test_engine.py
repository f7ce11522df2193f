"""The engine use case over fake ports: batching, preemption, stops, aborts, channels."""

from __future__ import annotations

import dataclasses

import pytest

from domain.common.errors import InvalidRequestError
from domain.contract.capabilities import NO_LOGPROBS
from domain.contract.frames import FrameResult
from domain.emission.outputs import ChoiceDelta, RequestEnd
from domain.engine.engine import Engine, EngineConfig
from domain.logprobs.rules import LogprobAsk
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams
from domain.telemetry.step_stats import SchedulerState
from tests.fakes import FAKE_EOS, FakeExecutor, FakeTokenizer, RecordingObserver, next_token
from tests.support.draining import channel_items
from tests.support.draining import drain as drain_engine
from tests.support.geometry import fake_geometry


def make_engine(
    *,
    capacity: int = 8,
    num_blocks: int = 64,
    block_size: int = 4,
    max_model_len: int = 64,
    budget: int = 32,
    eos_after: int | None = None,
    observer: RecordingObserver | None = None,
    prefix_caching: str | None = "sha256",
) -> tuple[Engine, FakeExecutor]:
    geometry = fake_geometry(
        logprobs=NO_LOGPROBS,
        capacity=capacity,
        block_size=block_size,
        num_blocks=num_blocks,
        max_model_len=max_model_len,
    )
    executor = FakeExecutor(geometry, eos_after=eos_after)
    config = EngineConfig(max_num_batched_tokens=budget, prefix_caching=prefix_caching)
    return Engine(executor, FakeTokenizer(), config, observer=observer), executor


def run(engine: Engine, requests: list[EngineRequest], failing=()) -> dict[str, list]:
    return drain_engine(engine, requests, failing)


def tokens_of(items: list, index: int = 0) -> list[int]:
    return [
        t for i in items if isinstance(i, ChoiceDelta) and i.index == index for t in i.token_ids
    ]


def expected_tokens(prompt: tuple[int, ...], count: int) -> list[int]:
    context, out = list(prompt), []
    for _ in range(count):
        token = next_token(context)
        out.append(token)
        context.append(token)
    return out


def request(rid: str, prompt_len: int, max_tokens: int, **params) -> EngineRequest:
    prompt = tuple(1 + (i * 7 + len(rid)) % 60 for i in range(prompt_len))
    return EngineRequest(
        rid, prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, **params)
    )


def test_many_concurrent_requests_get_exactly_the_tokens_each_gets_alone():
    requests = [request(f"r{i}", 3 + 5 * i, 4 + i) for i in range(6)]
    engine, _ = make_engine(budget=16)

    together = run(engine, requests)

    for r in requests:
        assert tokens_of(together[r.request_id]) == expected_tokens(
            r.prompt_token_ids, r.params.max_tokens
        )


def test_preemption_under_a_tiny_kv_budget_changes_no_output():
    requests = [request(f"r{i}", 6 + i, 10) for i in range(5)]
    steps = RecordingObserver()
    engine, _ = make_engine(
        num_blocks=12, block_size=2, max_model_len=24, budget=64, observer=steps
    )

    outputs = run(engine, requests)

    for r in requests:
        assert tokens_of(outputs[r.request_id]) == expected_tokens(r.prompt_token_ids, 10)
    assert steps.total("preemptions") > 0 and steps.state == SchedulerState()


def test_preemption_actually_happens_when_blocks_run_out():
    # Without the prefix cache, which would hand a readmitted prompt its blocks back.
    engine, executor = make_engine(
        num_blocks=12, block_size=2, max_model_len=24, budget=64, prefix_caching=None
    )
    run(engine, [request(f"r{i}", 6 + i, 10) for i in range(5)])

    restarts = [
        w
        for plan in executor.plans
        for w in plan.works
        if w.start_position == 0 and len(w.token_ids) > w.prompt_len
    ]

    assert restarts, "a readmitted sequence re-prefills its prompt plus its outputs"


def test_the_end_carries_usage_and_max_tokens_ends_with_length():
    engine, _ = make_engine()

    items = run(engine, [request("a", 5, 3)])["a"]

    assert items[-2].finish_reason == "length"
    assert items[-1] == RequestEnd(items[-1].usage) and items[-1].usage.completion_tokens == 3
    assert items[-1].usage.prompt_tokens == 5


def test_eos_ends_the_choice_with_stop_and_adds_no_text():
    engine, _ = make_engine(eos_after=2)

    items = run(engine, [request("a", 5, 10)])["a"]

    assert tokens_of(items)[-1] == FAKE_EOS and len(tokens_of(items)) == 3
    final = [i for i in items if isinstance(i, ChoiceDelta)][-1]
    assert final.finish_reason == "stop" and final.stop_reason is None
    assert "</s>" not in "".join(i.text for i in items if isinstance(i, ChoiceDelta))


def test_ignore_eos_keeps_generating_until_length():
    engine, _ = make_engine(eos_after=2)

    items = run(engine, [request("a", 5, 6, ignore_eos=True)])["a"]

    assert len(tokens_of(items)) == 6 and FAKE_EOS in tokens_of(items)
    assert [i for i in items if isinstance(i, ChoiceDelta)][-1].finish_reason == "length"


def test_min_tokens_bans_eos_until_reached():
    engine, _ = make_engine(eos_after=0)

    items = run(engine, [request("a", 5, 10, min_tokens=4)])["a"]

    assert len(tokens_of(items)) == 5 and tokens_of(items)[-1] == FAKE_EOS


def test_stop_string_truncates_text_and_reports_the_string():
    engine, _ = make_engine()
    r = request("a", 5, 12)
    text = "".join(chr(ord("a") + t % 26) for t in expected_tokens(r.prompt_token_ids, 12))
    stop = text[4:6]
    r = request("a", 5, 12, stop=(stop,))

    items = run(engine, [r])["a"]

    deltas = [i for i in items if isinstance(i, ChoiceDelta)]
    assert "".join(d.text for d in deltas) == text[: text.index(stop)]
    assert deltas[-1].finish_reason == "stop" and deltas[-1].stop_reason == stop


def test_n_choices_each_get_their_own_index_and_finish():
    engine, _ = make_engine()

    items = run(engine, [EngineRequest("a", (1, 2, 3), SamplingParams(max_tokens=3), n=3)])["a"]

    finishes = {i.index for i in items if isinstance(i, ChoiceDelta) and i.finished}
    assert finishes == {0, 1, 2} and items[-1].usage.completion_tokens == 9


def test_abort_frees_the_slot_and_blocks_at_once():
    steps = RecordingObserver()
    engine, _ = make_engine(num_blocks=64, observer=steps)
    channel = engine.submit(request("a", 9, 40))
    engine.step()
    engine.step()

    engine.abort("a")
    engine.step()

    items = channel_items(channel)
    assert [i for i in items if isinstance(i, ChoiceDelta)][-1].finish_reason == "abort"
    assert isinstance(items[-1], RequestEnd)
    # Nothing runs or waits, and every KV block is free again.
    assert steps.state == SchedulerState()
    assert not engine.has_work()


def test_a_prompt_at_the_model_length_is_rejected_before_admission():
    engine, _ = make_engine(max_model_len=16)

    with pytest.raises(InvalidRequestError) as caught:
        engine.submit(request("a", 16, 1))

    assert caught.value.param == "prompt" and not engine.has_work()


def test_prompt_plus_max_tokens_over_the_model_length_is_rejected():
    engine, _ = make_engine(max_model_len=16)

    with pytest.raises(InvalidRequestError) as caught:
        engine.submit(request("a", 10, 7))

    assert caught.value.param == "max_tokens"


def test_a_failing_step_fails_its_requests_and_the_engine_keeps_serving():
    engine, executor = make_engine()
    original = executor.submit
    executor.submit = lambda plan: (_ for _ in ()).throw(RuntimeError("boom"))
    failed = engine.submit(request("a", 5, 3))
    engine.step()
    executor.submit = original

    items = run(engine, [request("b", 5, 3)])

    end = channel_items(failed)[-1]
    assert isinstance(end, RequestEnd) and "boom" in end.error
    assert tokens_of(items["b"]) == expected_tokens(request("b", 5, 3).prompt_token_ids, 3)


def test_max_logprobs_caps_requests_below_the_cores_k():
    geometry = fake_geometry()
    engine = Engine(FakeExecutor(geometry), FakeTokenizer(), EngineConfig(max_logprobs=3))
    asks = EngineRequest("a", (1, 2), SamplingParams(), logprobs=LogprobAsk(wanted=True, count=4))

    with pytest.raises(InvalidRequestError, match="max allowed: 3"):
        engine.submit(asks)


class PayloadDroppingExecutor:
    """A broken executor: its frames lose every logprob payload."""

    def __init__(self, executor: FakeExecutor) -> None:
        self._executor = executor
        self.geometry = executor.geometry

    def submit(self, plan):
        return self._executor.submit(plan)

    def land(self) -> int | None:
        return self._executor.land()

    def settle(self, frame: int) -> None:
        self._executor.settle(frame)

    def read(self, frame: int) -> FrameResult:
        return dataclasses.replace(self._executor.read(frame), logprobs=())


def test_a_requesting_lane_without_logprob_payload_fails_that_request_only():
    geometry = fake_geometry()
    engine = Engine(PayloadDroppingExecutor(FakeExecutor(geometry)), FakeTokenizer())
    asks = EngineRequest(
        "asks", (1, 2), SamplingParams(max_tokens=3), logprobs=LogprobAsk(wanted=True, count=2)
    )

    outputs = run(engine, [asks, request("plain", 4, 3)], failing={"asks"})

    assert "logprobs were requested" in outputs["asks"][-1].error
    assert outputs["plain"][-1].error is None and len(tokens_of(outputs["plain"])) == 3
