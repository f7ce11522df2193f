"""The Prometheus adapter: StepStats and rejections become vLLM-named series, per app or across
processes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from adapters.metrics.prometheus import (
    INTER_TOKEN_LATENCY_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    TIME_TO_FIRST_TOKEN_BUCKETS,
    PrometheusMetrics,
)
from adapters.metrics.registry import (
    MULTIPROCESS_VARIABLE,
    MetricsRegistry,
    clear_multiprocess_directory,
    forget_process,
)
from domain.telemetry.step_stats import FinishedChoice, SchedulerState, StepStats
from tests.support.prometheus import Scrape

MODEL = "tiny"
REPO_ROOT = Path(__file__).resolve().parents[3]


def scrape(metrics: PrometheusMetrics) -> Scrape:
    return Scrape(metrics.render().decode("utf-8"))


def busy_step() -> StepStats:
    return StepStats(
        state=SchedulerState(running=3, waiting=2, kv_cache_usage=0.25),
        prompt_tokens=11,
        generation_tokens=7,
        preemptions=1,
        queue_times=(0.2, 3.0),
        first_token_times=(0.05,),
        inter_token_times=(0.02, 0.02, 0.3),
        finished=(FinishedChoice("stop", 1.0), FinishedChoice("abort", 4.0)),
        logprob_positions=5,
        logprob_payload_bytes=6720,
        prompt_rows_scored=9,
    )


def test_a_step_sets_the_gauges_and_adds_to_the_counters_exactly():
    metrics = PrometheusMetrics(MODEL)

    metrics.record_step(busy_step())
    metrics.record_step(StepStats(SchedulerState(1, 0, 0.5), generation_tokens=2))
    found = scrape(metrics)

    assert found.value("vllm:num_requests_running", model_name=MODEL) == 1
    assert found.value("vllm:num_requests_waiting", model_name=MODEL) == 0
    assert found.value("vllm:kv_cache_usage_perc", model_name=MODEL) == 0.5
    assert found.value("vllm:prompt_tokens_total", model_name=MODEL) == 11
    assert found.value("vllm:generation_tokens_total", model_name=MODEL) == 9
    assert found.value("vllm:num_preemptions_total", model_name=MODEL) == 1
    assert found.value("helios:logprob_positions_total", model_name=MODEL) == 5
    assert found.value("helios:logprob_payload_bytes_total", model_name=MODEL) == 6720
    assert found.value("helios:prompt_rows_scored_total", model_name=MODEL) == 9


def test_finished_choices_count_by_reason_and_every_reason_starts_at_zero():
    metrics = PrometheusMetrics(MODEL)
    before = scrape(metrics)

    metrics.record_step(busy_step())
    after = scrape(metrics)

    for reason in ("stop", "length", "abort", "error"):
        labels = {"model_name": MODEL, "finished_reason": reason}
        assert before.value("vllm:request_success_total", **labels) == 0
    assert after.value("vllm:request_success_total", model_name=MODEL, finished_reason="stop") == 1
    assert after.value("vllm:request_success_total", model_name=MODEL, finished_reason="abort") == 1
    assert (
        after.value("vllm:request_success_total", model_name=MODEL, finished_reason="length") == 0
    )


def test_latencies_land_in_vllms_buckets_with_exact_counts_and_sums():
    metrics = PrometheusMetrics(MODEL)

    metrics.record_step(busy_step())
    found = scrape(metrics)

    queue = found.buckets("vllm:request_queue_time_seconds", model_name=MODEL)
    assert queue["0.3"] == 1 and queue["2.5"] == 1 and queue["5.0"] == 2 and queue["+Inf"] == 2
    assert found.value("vllm:request_queue_time_seconds_count", model_name=MODEL) == 2
    assert found.value("vllm:request_queue_time_seconds_sum", model_name=MODEL) == 3.2
    itl = found.buckets("vllm:inter_token_latency_seconds", model_name=MODEL)
    assert itl["0.01"] == 0 and itl["0.025"] == 2 and itl["0.3"] == 3
    assert found.value("vllm:inter_token_latency_seconds_count", model_name=MODEL) == 3
    assert found.value("vllm:time_to_first_token_seconds_count", model_name=MODEL) == 1
    assert found.value("vllm:time_to_first_token_seconds_sum", model_name=MODEL) == 0.05
    assert found.value("vllm:e2e_request_latency_seconds_count", model_name=MODEL) == 2
    assert found.value("vllm:e2e_request_latency_seconds_sum", model_name=MODEL) == 5.0


@pytest.mark.parametrize(
    ("name", "bounds"),
    [
        ("vllm:time_to_first_token_seconds", TIME_TO_FIRST_TOKEN_BUCKETS),
        ("vllm:inter_token_latency_seconds", INTER_TOKEN_LATENCY_BUCKETS),
        ("vllm:e2e_request_latency_seconds", REQUEST_LATENCY_BUCKETS),
        ("vllm:request_queue_time_seconds", REQUEST_LATENCY_BUCKETS),
    ],
)
def test_histograms_expose_vllms_bucket_boundaries(name: str, bounds: tuple[float, ...]):
    found = scrape(PrometheusMetrics(MODEL))

    exposed = [key for key in found.buckets(name, model_name=MODEL) if key != "+Inf"]

    assert [float(key) for key in exposed] == list(bounds)


def test_rejections_count_by_reason():
    metrics = PrometheusMetrics(MODEL)

    for reason in ("invalid_request", "invalid_request", "overloaded"):
        metrics.request_rejected(reason)
    found = scrape(metrics)

    rejected = "helios:requests_rejected_total"
    assert found.value(rejected, model_name=MODEL, reason="invalid_request") == 2
    assert found.value(rejected, model_name=MODEL, reason="overloaded") == 1


def test_each_instance_keeps_its_own_values_so_many_apps_fit_in_one_process():
    first, second = PrometheusMetrics("a"), PrometheusMetrics("b")

    first.record_step(busy_step())

    assert scrape(first).value("vllm:prompt_tokens_total", model_name="a") == 11
    assert scrape(second).value("vllm:prompt_tokens_total", model_name="b") == 0


def test_the_exposition_is_plain_prometheus_text_without_created_samples():
    metrics = PrometheusMetrics(MODEL)
    metrics.record_step(busy_step())

    found = scrape(metrics)

    assert metrics.content_type.startswith("text/plain; version=0.0.4")
    assert not [name for name in found.names() if name.endswith("_created")]
    assert {"vllm:num_requests_running", "helios:prompt_rows_scored_total"} <= found.names()


_WORKER = textwrap.dedent(
    """
    import sys
    from adapters.metrics.prometheus import PrometheusMetrics
    from domain.telemetry.step_stats import SchedulerState, StepStats

    running, tokens = int(sys.argv[1]), int(sys.argv[2])
    metrics = PrometheusMetrics("tiny")
    metrics.record_step(StepStats(SchedulerState(running, 0, 0.0), generation_tokens=tokens))
    metrics.request_rejected("not_found")
    if len(sys.argv) > 3:
        print(metrics.render().decode())
    """
)


def _run_worker(directory: Path, *args: str) -> str:
    environment = {MULTIPROCESS_VARIABLE: str(directory), "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _WORKER, *args],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def test_multiprocess_mode_merges_every_process_s_counters(tmp_path: Path):
    _run_worker(tmp_path, "2", "5")
    _run_worker(tmp_path, "3", "7")
    merged = Scrape(_run_worker(tmp_path, "1", "11", "render"))

    assert merged.value("vllm:generation_tokens_total", model_name=MODEL) == 5 + 7 + 11
    assert merged.value("helios:requests_rejected_total", model_name=MODEL, reason="not_found") == 3
    # The processes above have exited but nobody marked them dead: the newest value wins.
    assert merged.value("vllm:num_requests_running", model_name=MODEL) == 1


def test_a_new_server_clears_the_previous_runs_files(tmp_path: Path):
    _run_worker(tmp_path, "2", "5")
    assert list(tmp_path.glob("*.db"))

    clear_multiprocess_directory({MULTIPROCESS_VARIABLE: str(tmp_path)})

    assert not list(tmp_path.glob("*.db"))


def test_a_dead_worker_s_gauges_are_forgotten_and_its_counters_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    _run_worker(tmp_path, "4", "5")
    (live,) = tmp_path.glob("gauge_livemostrecent_*.db")
    monkeypatch.setenv(MULTIPROCESS_VARIABLE, str(tmp_path))

    forget_process(int(live.stem.rsplit("_", 1)[1]))
    merged = Scrape(MetricsRegistry.from_environment().render().decode())

    assert not live.exists()
    assert "vllm:num_requests_running" not in merged.names()
    assert merged.value("vllm:generation_tokens_total", model_name=MODEL) == 5


_IDLE = textwrap.dedent(
    """
    import sys
    from adapters.metrics.prometheus import PrometheusMetrics

    metrics = PrometheusMetrics("tiny", reports_engine=sys.argv[1] == "engine")
    print(metrics.render().decode())
    """
)


def _idle_render(directory: Path, role: str) -> Scrape:
    directory.mkdir()
    environment = {MULTIPROCESS_VARIABLE: str(directory), "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _IDLE, role],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return Scrape(done.stdout)


def test_the_engine_s_reporter_shows_idle_gauges_before_any_step_and_api_processes_do_not(
    tmp_path: Path,
):
    gauges = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")

    api_only = _idle_render(tmp_path / "api", "api")
    engine = _idle_render(tmp_path / "engine", "engine")

    # An API process leaves the gauges to the engine's process: it never writes one.
    assert not set(gauges) & api_only.names()
    assert [engine.value(name, model_name=MODEL) for name in gauges] == [0, 0, 0]


def test_without_the_variable_the_registry_is_private_to_the_instance():
    registry = MetricsRegistry.from_environment({})

    assert registry.owner is not registry.exposed


def test_speculation_counts_use_vllm_s_names_and_count_each_position():
    metrics = PrometheusMetrics(MODEL)
    rounds = StepStats(
        SchedulerState(),
        spec_drafts=3,
        spec_draft_tokens=10,
        spec_accepted_tokens=6,
        spec_accepted_per_position=(3, 2, 1, 0),
    )

    metrics.record_step(rounds)
    metrics.record_step(rounds)
    found = scrape(metrics)

    assert found.value("vllm:spec_decode_num_drafts_total", model_name=MODEL) == 6
    assert found.value("vllm:spec_decode_num_draft_tokens_total", model_name=MODEL) == 20
    assert found.value("vllm:spec_decode_num_accepted_tokens_total", model_name=MODEL) == 12
    per_position = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    assert [found.value(per_position, model_name=MODEL, position=str(p)) for p in range(3)] == [
        6,
        4,
        2,
    ]
