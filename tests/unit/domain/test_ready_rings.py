"""A step wakes each consumer once, after the step has delivered to every channel."""

from __future__ import annotations

import threading

import pytest

from domain.emission.channel import OutputChannel
from domain.emission.outputs import ChoiceDelta, RequestEnd, Usage
from domain.emission.rings import ReadyRings
from domain.engine.engine import Engine, EngineConfig
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams
from tests.fakes import FakeExecutor, FakeTokenizer
from tests.support.geometry import fake_geometry


def test_outside_a_step_a_ready_call_is_made_at_once():
    calls: list[str] = []
    rings = ReadyRings()

    rings.ring(lambda: calls.append("a"))

    assert calls == ["a"]


def test_within_a_step_each_channel_s_call_waits_for_the_step_s_end_and_comes_once():
    calls: list[str] = []
    rings = ReadyRings()
    first = OutputChannel(on_ready=lambda: calls.append("first"))
    second = OutputChannel(on_ready=lambda: calls.append("second"))
    first.ring_through(rings)
    second.ring_through(rings)

    with rings:
        first.put(ChoiceDelta(0, "a", (1,)))
        second.put(ChoiceDelta(0, "b", (2,)))
        first.put(ChoiceDelta(0, "c", (3,)))
        first.put(RequestEnd(Usage(1, 2)))
        assert calls == []

    assert calls == ["first", "second"]
    assert len(first) == 3 and len(second) == 1
    second.put(ChoiceDelta(0, "d", (4,)))
    assert calls == ["first", "second", "second"]


def test_a_step_that_raises_still_wakes_the_consumers_it_delivered_to():
    calls: list[str] = []
    rings = ReadyRings()

    with pytest.raises(RuntimeError), rings:
        rings.ring(lambda: calls.append("woken"))
        raise RuntimeError("step failed")

    assert calls == ["woken"]


def test_a_blocking_reader_is_still_woken_by_the_put_itself():
    # The condition a blocking `get` waits on is notified at the put, step or no step.
    rings = ReadyRings()
    channel = OutputChannel()
    channel.ring_through(rings)
    got: list[object] = []
    reader = threading.Thread(target=lambda: got.append(channel.get(timeout=5)))

    with rings:
        reader.start()
        while not channel._waiting:  # the reader waits inside `get`
            threading.Event().wait(0.001)
        channel.put(ChoiceDelta(0, "a", (1,)))
        reader.join(5)
        assert got == [ChoiceDelta(0, "a", (1,))]


def test_an_engine_step_wakes_each_request_once_with_the_whole_step_already_delivered():
    geometry = fake_geometry(capacity=8, block_size=4, num_blocks=64, max_model_len=64)
    engine = Engine(FakeExecutor(geometry), FakeTokenizer(), EngineConfig())
    channels: list[OutputChannel] = []
    # What each consumer finds in every channel when it is woken.
    seen: list[tuple[str, list[int]]] = []

    def woken(name: str) -> None:
        seen.append((name, [len(channel) for channel in channels]))

    for index in range(4):
        channel = OutputChannel(on_ready=lambda name=f"r{index}": woken(name))
        channels.append(channel)
        params = SamplingParams(max_tokens=3, temperature=0.0)
        engine.submit(EngineRequest(f"r{index}", (1, 2, 3 + index), params), channel)

    steps = 0
    while engine.has_work():
        before = len(seen)
        engine.step()
        steps += 1
        woken_now = seen[before:]
        # One wake-up per request that got anything this step, each after all were delivered.
        assert len({name for name, _ in woken_now}) == len(woken_now)
        assert all(counts == woken_now[-1][1] for _, counts in woken_now)

    assert steps >= 3
    assert {name for name, _ in seen} == {"r0", "r1", "r2", "r3"}
    for channel in channels:
        items = []
        while (item := channel.get_nowait()) is not None:
            items.append(item)
        assert isinstance(items[-1], RequestEnd)
        assert sum(len(i.token_ids) for i in items if isinstance(i, ChoiceDelta)) == 3


def test_a_put_from_another_thread_during_a_step_calls_at_once():
    calls: list[str] = []
    rings = ReadyRings()
    channel = OutputChannel(on_ready=lambda: calls.append("woken"))
    channel.ring_through(rings)

    with rings:
        other = threading.Thread(target=channel.put, args=(ChoiceDelta(0, "a", (1,)),))
        other.start()
        other.join(5)
        assert calls == ["woken"]

    assert calls == ["woken"]


def test_one_consumer_s_failing_wake_up_does_not_cost_the_others_theirs():
    calls: list[str] = []
    rings = ReadyRings()

    def broken() -> None:
        raise RuntimeError("this consumer's loop is gone")

    with rings:
        rings.ring(broken)
        rings.ring(lambda: calls.append("second"))

    assert calls == ["second"]
