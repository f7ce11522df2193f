"""The engine's thread: runs `Engine.step` until stopped, waiting while there is no work."""

from __future__ import annotations

import logging
import threading

from domain.engine.engine import Engine

_log = logging.getLogger(__name__)


class EngineLoop:
    """Runs `Engine.step` on a daemon thread until stopped."""

    def __init__(self, engine: Engine, idle_wait: float = 0.05) -> None:
        self._engine = engine
        self._idle_wait = idle_wait
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="helios-engine", daemon=True)

    def start(self) -> None:
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
