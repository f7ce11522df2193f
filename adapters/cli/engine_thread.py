"""The engine's thread: runs `Engine.step` until stopped, waiting while there is no work."""

from __future__ import annotations

import logging
import sys
import threading

from domain.engine.engine import Engine

_log = logging.getLogger(__name__)
# How long a Python thread of the engine's process may hold the GIL while another waits for it,
# under the overlapped loop. There the executor's worker hands each step to the device; back
# from waiting for it, the worker needs the GIL to commit the step and start the next, and
# behind the engine's emission work it waited up to CPython's default 5 ms: with a 7 ms
# simulated device step its wait took 8.5 ms on average instead of 7. At 0.5 ms the overlapped
# loop made 101-108 steps a second instead of 82-94 (bench/host.py, 32 and 64 streams, K=20).
# The synchronous loop keeps the default: without a worker to feed the device, shorter turns
# only cost switches (no device step: 1,706 against 2,033 tokens a second for one stream).
SWITCH_INTERVAL_S = 0.0005


class EngineLoop:
    """Runs `Engine.step` on a daemon thread until stopped; `overlapped` when the engine runs
    the overlapped loop (`--async-scheduling`)."""

    def __init__(
        self, engine: Engine, idle_wait: float = 0.05, *, overlapped: bool = False
    ) -> None:
        self._engine = engine
        self._idle_wait = idle_wait
        self._overlapped = overlapped
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="helios-engine", daemon=True)

    def start(self) -> None:
        """Starts the engine's thread; under the overlapped loop the process's threads take
        turns at the GIL every `SWITCH_INTERVAL_S`."""
        if self._overlapped:
            sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._engine.wait_for_work(self._idle_wait)
            try:
                self._engine.step()
            except Exception:  # noqa: BLE001 - the loop outlives any single bad step
                _log.exception("engine step raised; the loop goes on")
