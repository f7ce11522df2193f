"""`helios serve --api-server-count N`: starts the engine process, watches it and stops it."""

from __future__ import annotations

import contextlib
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_log = logging.getLogger(__name__)
# The engine socket's shared secret, hex, in the environment of the serve process and so of
# the processes it starts; the socket's directory is the user's alone besides.
AUTHKEY_VARIABLE = "HELIOS_ENGINE_AUTHKEY"
SOCKET_NAME = "engine.sock"
STOP_TIMEOUT_S = 15.0


@dataclass
class EngineProcess:
    """The engine process (`python -m adapters.cli.engine_process`) and its socket's place.

    gunicorn's arbiter reaps every child it has, this one included, so the process is watched
    through a pidfd, which tells of its end whoever reaps it.
    """

    process: subprocess.Popen
    directory: Path
    _pidfd: int

    @property
    def address(self) -> str:
        return str(self.directory / SOCKET_NAME)

    @staticmethod
    def socket_address() -> tuple[Path, str]:
        """A fresh private directory (mode 0700) and the socket path in it."""
        directory = Path(tempfile.mkdtemp(prefix="helios-engine-"))
        return directory, str(directory / SOCKET_NAME)

    @classmethod
    def start(cls, directory: Path) -> EngineProcess:
        """Starts the engine process with this process's environment (the serve config and
        the authkey in it); its output joins this process's."""
        process = subprocess.Popen(
            [sys.executable, "-m", "adapters.cli.engine_process"], env=dict(os.environ)
        )
        return cls(process, directory, os.pidfd_open(process.pid))

    def watch(self, on_exit: Callable[[], None]) -> None:
        """Calls `on_exit` on a thread once the engine process has ended, however it ends."""

        def wait() -> None:
            select.select([self._pidfd], [], [])
            on_exit()

        threading.Thread(target=wait, name="engine-watch", daemon=True).start()

    @property
    def alive(self) -> bool:
        return not select.select([self._pidfd], [], [], 0)[0]

    def _signal(self, number: int) -> None:
        # Through the pidfd: the PID itself may already be reaped and reused.
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self._pidfd, number)

    def stop(self) -> None:
        """Asks the engine process to stop, kills it if it will not, and removes the socket's
        directory."""
        if self.alive:
            self._signal(signal.SIGTERM)
            if not select.select([self._pidfd], [], [], STOP_TIMEOUT_S)[0]:
                self._signal(signal.SIGKILL)
        os.close(self._pidfd)
        shutil.rmtree(self.directory, ignore_errors=True)
