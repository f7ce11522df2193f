"""`helios serve` with PROMETHEUS_MULTIPROC_DIR: values go through the files, stale ones go."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.conftest import running_server
from tests.support.http_json import post_url
from tests.support.prometheus import Scrape

pytestmark = [pytest.mark.e2e, pytest.mark.model]

MODEL = "multi"


def test_a_server_in_multiprocess_mode_exposes_the_files_it_writes_and_drops_stale_ones(
    e2e_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "prometheus"
    directory.mkdir()
    stale = directory / "counter_999999.db"
    stale.write_bytes(b"left over from an earlier run")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))

    with running_server(e2e_model_dir, tmp_path, "--served-model-name", MODEL) as server:
        answer = post_url(
            server.base_url,
            "/v1/completions",
            {"prompt": "the quick brown fox", "max_tokens": 4, "ignore_eos": True},
        )
        found = _scrape_after_last_step(server.base_url)
        while_serving = _kinds(directory)

    assert not stale.exists()
    assert while_serving == ["counter", "gauge", "histogram"]
    # The worker's exit (gunicorn's child_exit) drops its live gauges; counts stay.
    assert _kinds(directory) == ["counter", "histogram"]
    assert answer["usage"]["completion_tokens"] == 4
    assert found.value("vllm:generation_tokens_total", model_name=MODEL) == 4
    assert (
        found.value("vllm:request_success_total", model_name=MODEL, finished_reason="length") == 1
    )
    assert found.value("vllm:num_requests_running", model_name=MODEL) == 0


def _scrape_after_last_step(base_url: str) -> Scrape:
    """A scrape once the answer's last step is counted: the engine reports a step just after
    it hands the step's outputs over (docs/metrics.md), so a scrape that follows the answer at
    once may come a moment early."""
    deadline = time.monotonic() + 10
    while True:
        with urllib.request.urlopen(f"{base_url}/metrics", timeout=60) as response:
            found = Scrape(response.read().decode())
        if found.value("vllm:num_requests_running", model_name=MODEL) == 0:
            return found
        if time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def _kinds(directory: Path) -> list[str]:
    """The kinds of value file in the directory (`counter_<pid>.db` and so on)."""
    return sorted(path.name.split("_")[0] for path in directory.glob("*.db"))
