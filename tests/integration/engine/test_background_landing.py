"""The device's worker lands a late step while it waits, and commits it unless a plan came."""

from __future__ import annotations

import threading

from adapters.gpu.background_executor import BackgroundExecutor
from domain.contract.frames import FrameResult
from domain.engine.step import StepPlan
from tests.support.geometry import fake_geometry


class LateExecutor:
    """An executor whose every submission commits late: it logs what the worker asks of it,
    and `land` waits until the test lets the device's step end (`device_done`)."""

    def __init__(self) -> None:
        self.geometry = fake_geometry()
        self.calls: list[str] = []
        self.device_done = threading.Event()
        self.landing = threading.Event()
        self._late: int | None = None
        self._landed: int | None = None
        self._next = 0

    def submit(self, plan: StepPlan) -> int:
        if self._late is not None:
            self.land()
        frame, self._next = self._next, self._next ^ 1
        self.calls.append(f"launch {frame}")
        if self._landed is not None:
            self.calls.append(f"commit {self._landed}")
            self._landed = None
        self._late = frame
        return frame

    def land(self) -> int | None:
        if self._late is not None:
            self.landing.set()
            self.device_done.wait(10)
            self.device_done.clear()
            self._landed, self._late = self._late, None
        return self._landed

    def settle(self, frame: int) -> None:
        if self._late == frame:
            self.land()
        if self._landed == frame:
            self.calls.append(f"commit {frame}")
            self._landed = None

    def read(self, frame: int) -> FrameResult:
        self.settle(frame)
        return FrameResult(frame, ())


def test_a_late_step_is_committed_when_it_lands_and_no_plan_waits():
    inner = LateExecutor()
    background = BackgroundExecutor(inner)
    frame = background.submit(StepPlan(()))
    assert inner.landing.wait(10)
    inner.device_done.set()

    background.read(frame)
    background.close()

    assert inner.calls == ["launch 0", "commit 0"]


def test_a_plan_that_comes_while_a_step_lands_launches_before_that_step_commits():
    inner = LateExecutor()
    background = BackgroundExecutor(inner)
    first = background.submit(StepPlan(()))
    assert inner.landing.wait(10)
    inner.landing.clear()
    second = background.submit(StepPlan(()))  # queued while the worker waits for the device
    inner.device_done.set()

    background.read(first)
    assert inner.landing.wait(10)
    inner.device_done.set()
    background.read(second)
    background.close()

    assert inner.calls == ["launch 0", "launch 1", "commit 0", "commit 1"]
