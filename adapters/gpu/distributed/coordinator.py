"""Rank 0's executor: hands every plan to the peers, runs its own shard, alone reads frames back."""

from __future__ import annotations

import logging
from collections.abc import Callable

from adapters.gpu.distributed.collectives import ParallelFailure
from adapters.gpu.distributed.group import RankGroup
from adapters.gpu.executor import TorchExecutor
from domain.contract.frames import FrameResult
from domain.contract.geometry import ExecutorGeometry
from domain.engine.step import StepPlan

_log = logging.getLogger(__name__)


class CoordinatorExecutor:
    """Implements `ports.executor.ModelExecutor` for a tensor-parallel world, on rank 0.

    `submit` broadcasts the plan over the control group, then runs rank 0's executor, whose
    exchanges every peer joins with the same plan. Any failure that escapes a step leaves the
    ranks out of step, so it breaks the group for good: the step raises (its requests fail with
    the message), every later step raises at once, `failure` says why, and `on_failure` hears it
    once (the server uses it to report unhealthy and exit so that gunicorn restarts it). A lane's
    own failure (a grammar that breaks while its request runs, on any rank) escapes nothing:
    every rank retires that lane within the step, and the world goes on.
    """

    def __init__(
        self,
        executor: TorchExecutor,
        group: RankGroup,
        on_failure: Callable[[str], None] = lambda message: None,
    ) -> None:
        self._executor = executor
        self._group = group
        self._on_failure = on_failure
        self.failure: str | None = None

    @property
    def geometry(self) -> ExecutorGeometry:
        return self._executor.geometry

    @property
    def collectives(self):
        return self._group.collectives

    def submit(self, plan: StepPlan) -> int:
        if self.failure is not None:
            raise ParallelFailure(self.failure)
        try:
            self._group.send(plan)
            return self._executor.submit(plan)
        except Exception as error:
            self._break(error)
            raise ParallelFailure(self.failure or str(error)) from error

    def land(self) -> int | None:
        return self._executor.land()

    def settle(self, frame: int) -> None:
        self._executor.settle(frame)

    def read(self, frame: int) -> FrameResult:
        return self._executor.read(frame)

    def close(self) -> None:
        """Tells the peers to stop (when the group still works) and leaves the group."""
        if self.failure is None:
            try:
                self._group.send(None)
            except ParallelFailure:
                _log.warning("a peer was gone before the stop message")
        self._group.close()

    def _break(self, error: Exception) -> None:
        if self.failure is not None:
            return
        if isinstance(error, ParallelFailure):
            self.failure = str(error)
        else:
            self.failure = (
                f"a tensor-parallel step failed on rank 0 and left the ranks out of step: {error}"
            )
        _log.error("tensor parallelism is broken: %s", self.failure)
        self._on_failure(self.failure)
