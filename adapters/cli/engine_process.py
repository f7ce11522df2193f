"""Composition root of the engine process of `helios serve --api-server-count N` (N > 1).

It loads the model, runs the engine thread (rank 0 under tensor parallelism), keeps the
Responses store, reports the engine's metrics, and serves the API processes on a unix socket.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

from adapters.cli import bootstrap
from adapters.cli.asgi import start_engine
from adapters.cli.engine_supervisor import AUTHKEY_VARIABLE
from adapters.cli.heap import freeze_start_up_heap
from adapters.cli.serve_config import ServeConfig
from adapters.engine_ipc.messages import Hello
from adapters.engine_ipc.server import EngineServer
from adapters.metrics.prometheus import PrometheusMetrics
from domain.responses.store import ResponseStore

_log = logging.getLogger(__name__)
# How often the process looks whether `helios serve` still lives; orphaned, it exits.
_PARENT_CHECK_S = 1.0


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="[engine %(process)d] %(message)s")
    # Ctrl-C reaches the whole process group; the engine stays up while the API processes
    # finish their requests, and `helios serve` stops it after them (SIGTERM).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda number, frame: stopping.set())
    parent = os.getppid()
    config = ServeConfig.from_environment()
    if config.engine_address is None:
        raise SystemExit("the engine process needs HELIOS_SERVE_CONFIG with engine_address")
    authkey = bytes.fromhex(os.environ[AUTHKEY_VARIABLE])
    metrics = PrometheusMetrics(
        bootstrap.served_name(config.model, config.served_model_name), reports_engine=True
    )
    running = start_engine(config, metrics)
    loaded = running.loaded
    engine = loaded.engine
    hello = Hello.of_this_process(loaded.name, str(loaded.model_dir), engine)
    server = EngineServer(
        engine, hello, ResponseStore(), config.engine_address, authkey, failure=loaded.failure
    )
    server.start()
    freeze_start_up_heap()
    _log.info("the engine serves %s at %s", loaded.name, config.engine_address)
    while not stopping.wait(_PARENT_CHECK_S):
        if os.getppid() != parent:
            _log.warning("helios serve is gone; the engine process stops")
            break
    server.close()
    running.stop()


if __name__ == "__main__":
    main()
