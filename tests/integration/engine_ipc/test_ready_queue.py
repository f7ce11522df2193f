"""The engine session's ready queue: every ID put reaches its writer, however the threads switch."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import CodeType, FrameType

import pytest

from adapters.engine_ipc.ready_queue import ReadyQueue

IDS_A_TRIAL = 300
TRIALS = 5
STALL_SECONDS = 10.0  # a lost wake-up never ends; a loaded CI box may be slow


class Writer:
    """A writer thread as the session runs one: wait, drain, repeat, until closed."""

    def __init__(self, tracer: Callable[..., object] | None = None) -> None:
        self.tracer = tracer
        self.condition = threading.Condition()
        self.queue = ReadyQueue(self.condition)
        self.taken: list[str] = []
        self.closed = False
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        sys.settrace(self.tracer)
        while True:
            with self.condition:
                self.queue.wait(lambda: self.closed)
                if self.closed:
                    return
                self.taken.extend(self.queue.drain())
            time.sleep(0)  # the session sends the batch here, outside the lock

    def close(self) -> None:
        with self.condition:
            self.closed = True
            self.condition.notify_all()

    def has_taken(self, count: int) -> bool:
        deadline = time.monotonic() + STALL_SECONDS
        while len(self.taken) < count and time.monotonic() < deadline:
            time.sleep(0.001)
        return len(self.taken) >= count


@pytest.fixture
def writer() -> Iterator[Writer]:
    started = Writer()
    started.thread.start()
    yield started
    started.close()
    started.thread.join(timeout=5)


def test_a_put_wakes_the_sleeping_writer_which_takes_an_id_queued_twice_once(writer):
    time.sleep(0.05)  # the writer is asleep by now
    with writer.condition:  # the writer cannot drain until all three are queued
        writer.queue.put("a")
        writer.queue.put("b")
        writer.queue.put("a")

    assert writer.has_taken(2)
    time.sleep(0.05)
    assert writer.taken == ["a", "b"]


def test_closing_wakes_a_writer_with_nothing_queued(writer):
    time.sleep(0.05)

    writer.close()
    writer.thread.join(timeout=5)

    assert not writer.thread.is_alive()


def yield_at_every_bytecode_of(*codes: CodeType) -> Callable[..., object]:
    """A `sys.settrace` function that lets other threads run between any two bytecodes of
    `codes`: each thread then meets the other at every point, not the few a timer slice hits."""

    def each_opcode(frame: FrameType, event: str, arg: object) -> object:
        if event == "opcode":
            time.sleep(0)
        return each_opcode

    def on_call(frame: FrameType, event: str, arg: object) -> object:
        if frame.f_code not in codes:
            return None
        frame.f_trace_opcodes = True
        return each_opcode

    return on_call


def test_no_id_is_left_behind_when_either_thread_yields_between_any_two_bytecodes():
    # The flag this replaced lost a wake-up only when the engine's put fell inside the
    # writer's drain, about once in 300 trials of 2,000 IDs without tracing.
    queue_code = (ReadyQueue.put.__code__, ReadyQueue.wait.__code__, ReadyQueue.drain.__code__)
    tracer = yield_at_every_bytecode_of(*queue_code)
    sys.settrace(tracer)
    try:
        for trial in range(TRIALS):
            writer = Writer(tracer)
            writer.thread.start()
            for index in range(IDS_A_TRIAL):
                writer.queue.put(str(index))
            stalled = not writer.has_taken(IDS_A_TRIAL)
            writer.close()
            writer.thread.join(timeout=5)
            assert not stalled, f"trial {trial}: the writer slept with IDs queued"
            assert writer.taken == [str(index) for index in range(IDS_A_TRIAL)]
    finally:
        sys.settrace(None)
