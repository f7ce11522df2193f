"""The engine's thread steps the engine until stopped; the overlapped loop shortens GIL turns."""

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
@pytest.mark.parametrize("overlapped", [False, True], ids=["sync", "overlapped"])
def test_the_loop_steps_past_a_failing_step_and_shortens_gil_turns_only_when_overlapped(
    overlapped: bool,
) -> None:
    sys.setswitchinterval(0.005)  # CPython's default, which kept the device's worker waiting
    engine = _CountingEngine()
    loop = EngineLoop(cast(Engine, engine), overlapped=overlapped)

    loop.start()
    stepped = engine.twentieth.wait(10)
    loop.stop()

    assert stepped
    expected = SWITCH_INTERVAL_S if overlapped else 0.005
    assert sys.getswitchinterval() == pytest.approx(expected)
