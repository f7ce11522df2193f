"""What the engine tells its observer: counts, latencies from an injected clock, occupancy."""

from __future__ import annotations

import pytest

from domain.contract.capabilities import NO_LOGPROBS, LogprobCapability
from domain.contract.geometry import ExecutorGeometry
from domain.engine.engine import Engine, EngineConfig
from domain.logprobs.rules import LogprobAsk
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams
from domain.telemetry.step_stats import FinishedChoice, SchedulerState
from tests.fakes import (
    FAKE_POSITION_BYTES,
    FAKE_PROMPT_ROW_BYTES,
    FakeExecutor,
    FakeTokenizer,
    ManualClock,
    RecordingObserver,
)
from tests.support.draining import step_until_idle
from tests.support.geometry import fake_geometry

NUM_BLOCKS = 64
BLOCK_SIZE = 4
NATURAL_K20 = LogprobCapability(top_k=20, selects_ids=False)
# Scoring whole prompts of up to 32 rows in one prefill.
SCORING = LogprobCapability(top_k=20, selects_ids=False, scored_capacities=(32,))


def geometry(logprobs: LogprobCapability = NO_LOGPROBS, **overrides) -> ExecutorGeometry:
    sizes = {"block_size": BLOCK_SIZE, "num_blocks": NUM_BLOCKS, **overrides}
    return fake_geometry(logprobs=logprobs, **sizes)


def observed_engine(
    clock: ManualClock | None = None,
    *,
    eos_after: int | None = None,
    budget: int = 32,
    prefix_caching: str | None = "sha256",
    interval_s: float = 0.0,
    **geometry_overrides,
) -> tuple[Engine, RecordingObserver, FakeExecutor]:
    observer = RecordingObserver()
    executor = FakeExecutor(geometry(**geometry_overrides), eos_after=eos_after)
    engine = Engine(
        executor,
        FakeTokenizer(),
        EngineConfig(
            max_num_batched_tokens=budget,
            prefix_caching=prefix_caching,
            metrics_interval_s=interval_s,
        ),
        observer=observer,
        clock=clock or ManualClock(),
    )
    return engine, observer, executor


def request(rid: str, prompt_len: int, max_tokens: int | None, **fields) -> EngineRequest:
    prompt = tuple(1 + (i * 5 + len(rid)) % 60 for i in range(prompt_len))
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return EngineRequest(rid, prompt, params, **fields)


def test_latencies_are_measured_from_arrival_with_the_injected_clock():
    clock = ManualClock(100.0)
    engine, observer, _ = observed_engine(clock)
    engine.submit(request("a", 5, 3))

    clock.now = 100.5
    engine.step()  # scheduled, prefilled and first token in one step
    clock.now = 100.75
    engine.step()
    clock.now = 101.25
    engine.step()  # the third token ends the choice with length

    assert observer.observed("queue_times") == [0.5]
    assert observer.observed("first_token_times") == [0.5]
    assert observer.observed("inter_token_times") == [0.25, 0.5]
    assert observer.observed("finished") == [FinishedChoice("length", 1.25)]
    assert observer.total("prompt_tokens") == 5
    assert observer.total("generation_tokens") == 3


def test_the_state_after_each_step_counts_running_and_waiting_sequences_and_held_blocks():
    engine, observer, _ = observed_engine(capacity=1)
    engine.submit(request("first", 5, 3))
    engine.submit(request("second", 5, 3))

    engine.step()

    # 5 prompt positions of 4 per block hold 2 of the 64 blocks.
    assert observer.state == SchedulerState(running=1, waiting=1, kv_cache_usage=2 / NUM_BLOCKS)
    step_until_idle(engine)
    assert observer.state == SchedulerState(0, 0, 0.0)


def test_steps_that_change_nothing_are_not_reported():
    engine, observer, _ = observed_engine()

    engine.step()
    engine.submit(request("a", 3, 2))
    step_until_idle(engine)
    reported = len(observer.steps)
    engine.step()
    engine.step()

    assert observer.steps[0].state == SchedulerState(1, 0, 1 / NUM_BLOCKS)
    assert len(observer.steps) == reported == 2


def test_a_busy_engine_reports_once_an_interval_and_again_as_it_goes_idle():
    clock = ManualClock(100.0)
    engine, observer, _ = observed_engine(clock, interval_s=0.025)
    engine.submit(request("a", 5, 4))
    engine.submit(request("b", 5, 6))

    engine.step()  # the first report is due at once
    assert len(observer.steps) == 1
    clock.now = 100.01
    engine.step()
    clock.now = 100.02
    engine.step()
    assert len(observer.steps) == 1, "a busy engine reported within the interval"
    clock.now = 100.03
    engine.step()  # due again: carries the two steps it waited over
    assert len(observer.steps) == 2
    assert observer.total("generation_tokens") == 8
    assert observer.observed("inter_token_times") == pytest.approx([0.01] * 6)
    assert [finished.reason for finished in observer.observed("finished")] == ["length"]
    clock.now = 100.031
    step_until_idle(engine)  # "b" ends two steps later, and the engine goes idle

    assert len(observer.steps) == 3, "the steps to the idle one waited, then reported at once"
    assert observer.total("generation_tokens") == 10
    assert [finished.reason for finished in observer.observed("finished")] == ["length"] * 2
    assert observer.state == SchedulerState(0, 0, 0.0)


def test_a_stop_token_finishes_the_choice_with_stop():
    engine, observer, _ = observed_engine(eos_after=2)
    stopping = EngineRequest("a", (3, 4, 5), SamplingParams(max_tokens=10))

    engine.submit(stopping)
    step_until_idle(engine)

    assert [f.reason for f in observer.observed("finished")] == ["stop"]
    assert observer.total("generation_tokens") == 3  # two tokens, then the stop token


def test_every_choice_of_a_request_is_counted_as_vllm_counts_child_requests():
    engine, observer, _ = observed_engine()

    engine.submit(request("a", 4, 3, n=3))
    step_until_idle(engine)

    assert observer.total("prompt_tokens") == 3 * 4
    assert observer.total("generation_tokens") == 3 * 3
    assert len(observer.observed("queue_times")) == 3
    assert len(observer.observed("first_token_times")) == 3
    assert len(observer.observed("inter_token_times")) == 3 * 2
    assert [f.reason for f in observer.observed("finished")] == ["length"] * 3


def test_an_abort_while_waiting_finishes_with_abort_and_no_queue_time_or_prompt():
    clock = ManualClock(10.0)
    engine, observer, _ = observed_engine(clock, capacity=1)
    engine.submit(request("running", 5, 4))
    engine.submit(request("waiting", 5, 4))
    engine.step()

    clock.now = 12.0
    engine.abort("waiting")
    step_until_idle(engine)

    finished = observer.observed("finished")
    assert FinishedChoice("abort", 2.0) in finished and len(finished) == 2
    assert observer.observed("queue_times") == [0.0]
    assert observer.total("prompt_tokens") == 5


def test_an_abort_of_a_running_request_keeps_the_tokens_it_generated():
    engine, observer, _ = observed_engine()
    engine.submit(request("a", 5, 20))
    engine.step()
    engine.step()

    engine.abort("a")
    step_until_idle(engine)

    assert [f.reason for f in observer.observed("finished")] == ["abort"]
    assert observer.total("generation_tokens") == 2
    assert observer.state == SchedulerState(0, 0, 0.0)


def test_a_failed_step_finishes_its_choices_with_error():
    engine, observer, executor = observed_engine()

    def failing_submit(plan):
        raise RuntimeError("device fault")

    executor.submit = failing_submit
    engine.submit(request("a", 5, 3))
    step_until_idle(engine)

    assert [f.reason for f in observer.observed("finished")] == ["error"]
    assert observer.total("generation_tokens") == 0


def test_preemptions_are_reported_once_each_and_re_prefills_add_no_prompt_tokens():
    # Without the prefix cache, which would hand a readmitted prompt its blocks back.
    engine, observer, executor = observed_engine(
        num_blocks=12, block_size=2, max_model_len=24, budget=64, prefix_caching=None
    )
    requests = [request(f"r{i}", 6 + i, 10) for i in range(5)]

    for r in requests:
        engine.submit(r)
    step_until_idle(engine)

    # Every admission starts a chunk at position 0: one per request, then one per preemption.
    admissions = sum(w.start_position == 0 for plan in executor.plans for w in plan.works)
    assert observer.total("preemptions") == admissions - len(requests) > 0
    assert observer.total("prompt_tokens") == sum(len(r.prompt_token_ids) for r in requests)
    assert observer.total("generation_tokens") == 5 * 10
    assert len(observer.observed("queue_times")) == 5
    assert len(observer.observed("inter_token_times")) == 5 * 9


def test_logprob_positions_and_payload_bytes_come_from_what_the_frames_carried():
    engine, observer, _ = observed_engine(logprobs=NATURAL_K20)
    asks = request("asks", 4, 3, logprobs=LogprobAsk(wanted=True, count=2))

    engine.submit(asks)
    engine.submit(request("plain", 4, 3))
    step_until_idle(engine)

    assert observer.total("logprob_positions") == 3
    assert observer.total("logprob_payload_bytes") == 3 * FAKE_POSITION_BYTES


def test_scored_prompt_rows_are_counted_once_per_position_with_a_target():
    engine, observer, _ = observed_engine(logprobs=SCORING)

    engine.submit(request("scored", 6, 2, logprobs=LogprobAsk(prompt_logprobs=1)))
    step_until_idle(engine)

    assert observer.total("prompt_rows_scored") == 6 - 1
    # The scored read copies every fed row, the last one (no target) included.
    assert observer.total("logprob_payload_bytes") == 6 * FAKE_PROMPT_ROW_BYTES
    assert observer.total("generation_tokens") == 2


def test_a_prefill_only_request_counts_its_prompt_and_ends_with_length_without_tokens():
    engine, observer, _ = observed_engine(logprobs=SCORING)

    engine.submit(
        request("echo", 6, 1, n=2, logprobs=LogprobAsk(prompt_logprobs=1), prefill_only=True)
    )
    step_until_idle(engine)

    # Choice 0 scores the prompt; choice 1 waited for it and ends unscheduled.
    assert observer.total("prompt_tokens") == 6
    assert observer.total("generation_tokens") == 0
    assert len(observer.observed("queue_times")) == 1
    assert observer.observed("first_token_times") == []
    assert [f.reason for f in observer.observed("finished")] == ["length", "length"]


def test_an_observer_that_raises_never_stops_the_engine(caplog: pytest.LogCaptureFixture):
    class Broken:
        def record_step(self, stats):
            raise ValueError("metrics backend down")

    executor = FakeExecutor(geometry())
    engine = Engine(executor, FakeTokenizer(), observer=Broken())

    channel = engine.submit(request("a", 4, 3))
    step_until_idle(engine)

    items = []
    while (item := channel.get_nowait()) is not None:
        items.append(item)
    assert items[-1].error is None and items[-1].usage.completion_tokens == 3
    assert "the engine observer failed" in caplog.text
