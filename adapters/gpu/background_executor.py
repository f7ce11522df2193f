"""Runs another executor's submissions on one worker thread, so the engine works while it runs."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from domain.contract.frames import FrameResult
from domain.contract.geometry import ExecutorGeometry
from domain.engine.step import StepPlan
from ports.executor import ModelExecutor

_log = logging.getLogger(__name__)
# A function the worker runs, its arguments, and the future its result goes to.
_Job = tuple[Callable[..., Any], tuple[Any, ...], Future[Any]]


class BackgroundExecutor:
    """Implements `ports.executor.ModelExecutor` over `inner`: `submit` queues the plan and
    returns at once, and the worker thread submits the plans to `inner` in order; `read`
    waits until its frame's submission is done and committed (the worker settles it: an inner
    submission may leave its commit until the next one is launched, so that the host's commit
    of step N runs while the device runs step N + 1), then reads the frame on the calling
    thread.

    So the engine reads and emits step N while the worker runs step N + 1: the inner
    executor's two frames hold the two steps, and `read` of one touches nothing that `submit`
    of the other writes (`CompletionOutputs` keeps records, requests and payload per frame).
    Only the worker submits, so the inner executor's per-slot state (penalties, grammar
    matchers, the previous submission's tokens that fill a plan made ahead) changes in
    submission order. A submission that raised raises from its `read`. On CUDA the frame's
    copy to the host queues behind the next step on the default stream, so there the read
    overlaps only the host's decoding, not the device.
    """

    def __init__(self, inner: ModelExecutor) -> None:
        self._inner = inner
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name="helios-device", daemon=True)
        self._thread.start()
        self._submitted: dict[int, Future[int]] = {}
        self._next_frame = 0

    @property
    def geometry(self) -> ExecutorGeometry:
        return self._inner.geometry

    def submit(self, plan: StepPlan) -> int:
        frame = self._next_frame
        if frame in self._submitted:
            raise RuntimeError(f"frame {frame} is submitted again before it was read")
        self._next_frame ^= 1
        self._submitted[frame] = self._call(self._inner.submit, plan)
        return frame

    def land(self) -> int | None:
        """The worker lands steps by itself, between submissions."""
        return None

    def settle(self, frame: int) -> None:
        """Has the worker commit `frame` if its submission left the commit for later: only
        the worker touches the inner executor's per-slot state."""
        self._submitted.pop(frame).result()
        self._call(self._inner.settle, frame).result()

    def read(self, frame: int) -> FrameResult:
        if frame in self._submitted:
            self.settle(frame)
        return self._inner.read(frame)

    def close(self) -> None:
        """Lets the submissions queued finish, then ends the worker."""
        self._jobs.put(None)
        self._thread.join()

    def _call(self, function: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._jobs.put((function, args, future))
        return future

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            function, args, future = job
            try:
                future.set_result(function(*args))
            except BaseException as error:  # noqa: BLE001 - raised again by the caller's result()
                future.set_exception(error)
            if not self._jobs.empty():
                continue
            # Idle with a step on the device: take its tokens when it ends, then commit it at
            # once unless the next plan came meanwhile, which launches first (its commit then
            # runs while the device runs that plan). When the engine is the slower side, the
            # step it reads next is committed before it asks.
            try:
                landed = self._inner.land()
                if landed is not None and self._jobs.empty():
                    self._inner.settle(landed)
            except Exception:  # noqa: BLE001 - executors keep a step's failure for its read
                _log.exception("landing a step on the device's worker failed")
