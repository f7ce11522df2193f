"""The engine's thread steps the engine until stopped, and shortens the GIL's turns."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from typing import cast

import pytest

from adapters.cli.engine_thread import SWITCH_INTERVAL_S, EngineLoop
from domain.engine.engine import Engine


class _CountingEngine:
    """Counts steps; the tenth raises, which the loop must outlive."""

    def __init__(self) -> None:
        self.steps = 0
        self.twentieth = threading.Event()

    def wait_for_work(self, timeout: float) -> None:
        pass

    def step(self) -> None:
        self.steps += 1
        if self.steps == 20:
            self.twentieth.set()
        if self.steps == 10:
            raise RuntimeError("one bad step")


@pytest.fixture
def switch_interval() -> Iterator[None]:
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


@pytest.mark.usefixtures("switch_interval")
def test_the_loop_steps_past_a_failing_step_with_half_millisecond_gil_turns() -> None:
    engine = _CountingEngine()
    loop = EngineLoop(cast(Engine, engine))

    loop.start()
    stepped = engine.twentieth.wait(10)
    loop.stop()

    assert stepped
    assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)
    assert SWITCH_INTERVAL_S < 0.005  # CPython's default, which kept the device's worker waiting
