"""The engine's thread: runs `Engine.step` until stopped, waiting while there is no work."""

from __future__ import annotations

import logging
import sys
import threading

from domain.engine.engine import Engine

_log = logging.getLogger(__name__)
# How long a Python thread of the engine's process may hold the GIL while another waits for it.
# Several threads share it (the engine; under --async-scheduling the executor's worker, which
# hands each step to the device; the event loop, or the engine socket's reader and writer). A
# worker back from waiting for the device needs the GIL to commit the step and start the next,
# and behind the engine's emission work it waited up to CPython's default 5 ms: with a 7 ms
# simulated device step the worker's wait took 8.5 ms on average instead of 7. At 0.5 ms the
# overlapped loop made 101-108 steps a second instead of 82-94 (bench/host.py, 32 and 64
# streams, K=20; docs/performance.md).
SWITCH_INTERVAL_S = 0.0005


class EngineLoop:
    """Runs `Engine.step` on a daemon thread until stopped."""

    def __init__(self, engine: Engine, idle_wait: float = 0.05) -> None:
        self._engine = engine
        self._idle_wait = idle_wait
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="helios-engine", daemon=True)

    def start(self) -> None:
        """Starts the engine's thread, and makes the process's threads take turns at the GIL
        every `SWITCH_INTERVAL_S`."""
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
