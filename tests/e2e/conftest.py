"""Fixtures: real `helios serve` processes (gunicorn, one worker) over a tiny model."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import openai
import pytest

from tests.support.marker_guard import require
from tests.support.tiny_serving import build_tiny_model_dir

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
# 16 sequences of 256 positions need 2 MiB with the tiny model (512 bytes a position); twice
# that keeps every test free of preemption while staying far below the 1 GiB CPU default.
KV_CACHE_BYTES = 4 << 20
MAX_MODEL_LEN = 256
MAX_NUM_SEQS = 16


@dataclass(frozen=True)
class RunningServer:
    """A started server: where to reach it, where its gunicorn output goes, and the process id
    of its gunicorn master (0 until started)."""

    base_url: str
    log_path: Path
    pid: int = 0

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def openai_client(self, api_key: str = "unused", timeout: float = 300) -> openai.OpenAI:
        """The official client for this server: no retries, so a failure shows at once."""
        return openai.OpenAI(
            base_url=f"{self.base_url}/v1", api_key=api_key, max_retries=0, timeout=timeout
        )


def free_port() -> int:
    """A port the kernel just handed out; the tiny window before the server binds it is benign."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def server_environment(workdir: Path) -> dict[str, str]:
    """The environment of a server (or of a process beside it) that keeps to `workdir`."""
    environment = dict(os.environ)
    # A key or config left in the developer's shell would silently change what is served.
    environment.pop("HELIOS_API_KEY", None)
    environment.pop("HELIOS_SERVE_CONFIG", None)
    # Nor may a tensor-parallel rendezvous: two servers would meet at the same port.
    for name in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK"):
        environment.pop(name, None)
    # gunicorn's control socket defaults to one path per user; give each server its own.
    environment["XDG_RUNTIME_DIR"] = str(workdir)
    environment["TOKENIZERS_PARALLELISM"] = "false"
    environment["PYTHONUNBUFFERED"] = "1"
    return environment


def health_status(base_url: str) -> int | None:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=STOP_TIMEOUT_S)


@contextmanager
def running_server(
    model_dir: Path | None,
    workdir: Path,
    *extra_args: str,
    environment: Mapping[str, str] | None = None,
    ready_timeout_s: float = READY_TIMEOUT_S,
) -> Iterator[RunningServer]:
    """Starts `helios serve` (None: the embedded SmolLM2) on a free port, waits for /health 200,
    and stops it afterwards; later flags in `extra_args` override the defaults, and
    `environment` adds to the server's variables."""
    require("e2e", "it started a helios serve process")
    if model_dir is None:
        require("model", "it served the embedded SmolLM2")
    port = free_port()
    server = RunningServer(f"http://127.0.0.1:{port}", workdir / "server.log")
    command = [
        sys.executable,
        "-m",
        "adapters.cli.main",
        "serve",
        *([str(model_dir)] if model_dir is not None else []),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--kv-cache-memory",
        str(KV_CACHE_BYTES),
        "--max-num-seqs",
        str(MAX_NUM_SEQS),
        "--device",
        "cpu",
        *extra_args,
    ]
    # A file, not a pipe: nobody drains the output while tests run, and a full pipe would stall
    # the server on its next access-log line.
    with server.log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env={**server_environment(workdir), **(environment or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    server = replace(server, pid=process.pid)
    try:
        _wait_until_healthy(process, server, ready_timeout_s)
        yield server
    finally:
        _stop(process)


def _wait_until_healthy(
    process: subprocess.Popen, server: RunningServer, timeout_s: float = READY_TIMEOUT_S
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(
                f"helios serve exited with {process.returncode} before it was healthy:\n"
                f"{server.log()}",
                pytrace=False,
            )
        if health_status(server.base_url) == 200:
            return
        time.sleep(0.1)
    pytest.fail(
        f"helios serve was not healthy within {timeout_s:.0f} s:\n{server.log()}",
        pytrace=False,
    )


@pytest.fixture(scope="session")
def e2e_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model_dir(tmp_path_factory.mktemp("e2e-tiny-llama"))


@pytest.fixture(scope="session")
def server(
    e2e_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    with running_server(e2e_model_dir, tmp_path_factory.mktemp("e2e-server")) as running:
        yield running


@pytest.fixture(scope="module")
def keyed_server(
    e2e_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    """A second server that demands `Authorization: Bearer secret` on /v1 routes."""
    workdir = tmp_path_factory.mktemp("e2e-keyed-server")
    with running_server(e2e_model_dir, workdir, "--api-key", "secret") as running:
        yield running
