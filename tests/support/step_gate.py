"""Holds a real executor's steps until the test lets each one run, so timing is the test's."""

from __future__ import annotations

import asyncio
import threading
import time


class StepGate:
    """Wraps `executor.submit`: every step waits for a permit from `allow`.

    `arrivals` counts steps that reached the gate, so a test can wait until the engine is
    parked at a known step before it acts.
    """

    def __init__(self, executor: object) -> None:
        self._executor = executor
        self._submit = executor.submit
        self._permits = threading.Semaphore(0)
        self._lock = threading.Lock()
        self.arrivals = 0
        executor.submit = self._gated_submit

    def _gated_submit(self, plan):
        with self._lock:
            self.arrivals += 1
        self._permits.acquire()
        return self._submit(plan)

    def allow(self, steps: int = 1) -> None:
        for _ in range(steps):
            self._permits.release()

    def remove(self) -> None:
        """Restores the executor's own submit; only once no step waits at the gate."""
        self._executor.submit = self._submit

    async def reached(self, arrivals: int, timeout: float = 30.0) -> None:
        """Waits, without blocking the event loop, until `arrivals` steps reached the gate."""
        deadline = time.monotonic() + timeout
        while self.arrivals < arrivals:
            if time.monotonic() > deadline:
                raise AssertionError(f"only {self.arrivals} of {arrivals} steps reached the gate")
            await asyncio.sleep(0.005)
