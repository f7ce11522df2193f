"""Runs another executor's submissions on one worker thread, so the engine plans while it works."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

from domain.contract.frames import FrameResult
from domain.contract.geometry import ExecutorGeometry
from domain.engine.step import StepPlan
from ports.executor import ModelExecutor


class BackgroundExecutor:
    """Implements `ports.executor.ModelExecutor` over `inner`: `submit` queues the plan and
    returns at once; the worker thread submits it to `inner` and reads its frame back at once,
    in submission order; `read` waits for that result.

    Reading on the worker as soon as a step completes keeps the double-buffered frames safe
    however far the engine runs ahead, and puts the decoding of the frame's records and
    logprobs on the worker too, beside the device. The worker is the only thread that touches
    `inner`, so its per-slot state (penalties, grammar matchers, the previous submission's
    tokens that fill a plan made ahead) changes in submission order. A submission that raises
    raises from its `read`.
    """

    def __init__(self, inner: ModelExecutor) -> None:
        self._inner = inner
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="helios-device")
        self._results: dict[int, Future[FrameResult]] = {}
        self._next_frame = 0

    @property
    def geometry(self) -> ExecutorGeometry:
        return self._inner.geometry

    @property
    def inner(self) -> ModelExecutor:
        return self._inner

    def submit(self, plan: StepPlan) -> int:
        frame = self._next_frame
        if frame in self._results:
            raise RuntimeError(f"frame {frame} is submitted again before it was read")
        self._next_frame ^= 1
        self._results[frame] = self._worker.submit(self._run, plan)
        return frame

    def read(self, frame: int) -> FrameResult:
        return self._results.pop(frame).result()

    def close(self) -> None:
        """Lets the submissions queued finish, then ends the worker."""
        self._worker.shutdown(wait=True)

    def _run(self, plan: StepPlan) -> FrameResult:
        return self._inner.read(self._inner.submit(plan))
