"""Runs another executor's submissions on one worker thread, so the engine works while it runs."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

from domain.contract.frames import FrameResult
from domain.contract.geometry import ExecutorGeometry
from domain.engine.step import StepPlan
from ports.executor import ModelExecutor


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
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="helios-device")
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
        self._submitted[frame] = self._worker.submit(self._inner.submit, plan)
        return frame

    def settle(self, frame: int) -> None:
        """Has the worker commit `frame` if its submission left the commit for later: only
        the worker touches the inner executor's per-slot state."""
        self._submitted.pop(frame).result()
        self._worker.submit(self._inner.settle, frame).result()

    def read(self, frame: int) -> FrameResult:
        if frame in self._submitted:
            self.settle(frame)
        return self._inner.read(frame)

    def close(self) -> None:
        """Lets the submissions queued finish, then ends the worker."""
        self._worker.shutdown(wait=True)
