"""The served model's Prometheus metrics: vLLM's names and buckets, plus Helios's own counts."""

from __future__ import annotations

from typing import Final

from prometheus_client import Counter, Gauge, Histogram

from adapters.metrics.batched import observe_all
from adapters.metrics.registry import CONTENT_TYPE, MetricsRegistry
from domain.telemetry.step_stats import FINISH_REASONS, StepStats

# vLLM's bucket boundaries (vllm/v1/metrics/loggers.py), so dashboards built for it read ours.
TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
INTER_TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
    0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
    30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
# One process (the engine's) sets the gauges; with several processes the newest value of a
# live one is the truth, and a dead worker's files go with `forget_process`.
GAUGE_MODE: Final = "livemostrecent"


class PrometheusMetrics:
    """Implements `ports.metrics.EngineObserver` and `RejectionObserver` for one model name.

    Every series carries `model_name`; `render` is what `GET /metrics` sends. The process that
    reports the engine's steps passes `reports_engine`: its gauges read 0 from the start.
    """

    def __init__(
        self,
        model_name: str,
        registry: MetricsRegistry | None = None,
        *,
        reports_engine: bool = False,
    ) -> None:
        self._registry = registry or MetricsRegistry.from_environment()
        self._model_name = model_name
        owner = self._registry.owner
        by_model = ("model_name",)

        def gauge(name: str, documentation: str) -> Gauge:
            return Gauge(
                name, documentation, by_model, registry=owner, multiprocess_mode=GAUGE_MODE
            ).labels(model_name)

        def counter(name: str, documentation: str) -> Counter:
            return Counter(name, documentation, by_model, registry=owner).labels(model_name)

        def histogram(name: str, documentation: str, buckets: tuple[float, ...]) -> Histogram:
            parent = Histogram(name, documentation, by_model, registry=owner, buckets=buckets)
            return parent.labels(model_name)

        self._running = gauge("vllm:num_requests_running", "Sequences in model execution.")
        self._waiting = gauge("vllm:num_requests_waiting", "Sequences waiting for a slot.")
        self._kv_usage = gauge(
            "vllm:kv_cache_usage_perc", "Fraction of KV-cache blocks in use; 1 means all."
        )
        if reports_engine:
            # In multiprocess mode a gauge never set has no sample at all (its newest value
            # is the one with a timestamp), so before the engine's first step `/metrics`
            # lacked the three; only the engine's reporter sets them, so that an API process
            # started later never overwrites a live value with 0.
            for idle in (self._running, self._waiting, self._kv_usage):
                idle.set(0)
        self._prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens prefilled.")
        self._generation_tokens = counter("vllm:generation_tokens", "Tokens generated.")
        self._preemptions = counter("vllm:num_preemptions", "Sequences preempted.")
        self._prefix_queries = counter(
            "vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache."
        )
        self._prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prompt tokens the prefix cache held (not computed)."
        )
        success = Counter(
            "vllm:request_success",
            "Choices finished, by finish reason.",
            (*by_model, "finished_reason"),
            registry=owner,
        )
        self._success = success
        # Created up front so every reason reads 0 before it first happens, as in vLLM.
        self._success_by_reason = {
            reason: success.labels(model_name, reason) for reason in FINISH_REASONS
        }
        self._time_to_first_token = histogram(
            "vllm:time_to_first_token_seconds",
            "Seconds from arrival to a choice's first token.",
            TIME_TO_FIRST_TOKEN_BUCKETS,
        )
        self._inter_token = histogram(
            "vllm:inter_token_latency_seconds",
            "Seconds between a choice's consecutive tokens.",
            INTER_TOKEN_LATENCY_BUCKETS,
        )
        self._e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Seconds from arrival to a choice's end.",
            REQUEST_LATENCY_BUCKETS,
        )
        self._queue = histogram(
            "vllm:request_queue_time_seconds",
            "Seconds from arrival to a choice's first scheduling.",
            REQUEST_LATENCY_BUCKETS,
        )
        self._logprob_positions = counter(
            "helios:logprob_positions", "Generated positions whose logprobs were read back."
        )
        self._payload_bytes = counter(
            "helios:logprob_payload_bytes",
            "Bytes of logprob and prompt-score payload copied from the device to the host.",
        )
        self._prompt_rows = counter(
            "helios:prompt_rows_scored", "Prompt rows scored against their next prompt token."
        )
        self._spec_drafts = counter(
            "vllm:spec_decode_num_drafts", "Verification rounds that offered drafts."
        )
        self._spec_draft_tokens = counter(
            "vllm:spec_decode_num_draft_tokens", "Draft tokens offered for verification."
        )
        self._spec_accepted = counter(
            "vllm:spec_decode_num_accepted_tokens", "Draft tokens the target accepted."
        )
        self._spec_per_position = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Rounds whose drafts stood up to and including each position (0-based).",
            (*by_model, "position"),
            registry=owner,
        )
        self._rejected = Counter(
            "helios:requests_rejected",
            "Requests answered with an error envelope, by reason.",
            (*by_model, "reason"),
            registry=owner,
        )

    @property
    def content_type(self) -> str:
        return CONTENT_TYPE

    def render(self) -> bytes:
        return self._registry.render()

    def record_step(self, stats: StepStats) -> None:
        state = stats.state
        self._running.set(state.running)
        self._waiting.set(state.waiting)
        self._kv_usage.set(state.kv_cache_usage)
        # Counters only move when there is something to add: each inc takes a lock (and, in
        # multiprocess mode, writes a file).
        for child, amount in (
            (self._prompt_tokens, stats.prompt_tokens),
            (self._generation_tokens, stats.generation_tokens),
            (self._preemptions, stats.preemptions),
            (self._prefix_queries, stats.prefix_cache_queries),
            (self._prefix_hits, stats.prefix_cache_hits),
            (self._logprob_positions, stats.logprob_positions),
            (self._payload_bytes, stats.logprob_payload_bytes),
            (self._prompt_rows, stats.prompt_rows_scored),
            (self._spec_drafts, stats.spec_drafts),
            (self._spec_draft_tokens, stats.spec_draft_tokens),
            (self._spec_accepted, stats.spec_accepted_tokens),
        ):
            if amount:
                child.inc(amount)
        for position, rounds in enumerate(stats.spec_accepted_per_position):
            if rounds:
                self._spec_per_position.labels(self._model_name, str(position)).inc(rounds)
        observe_all(self._queue, stats.queue_times)
        observe_all(self._time_to_first_token, stats.first_token_times)
        observe_all(self._inter_token, stats.inter_token_times)
        for finished in stats.finished:
            reason = self._success_by_reason.get(finished.reason)
            if reason is None:
                reason = self._success.labels(self._model_name, finished.reason)
            reason.inc()
            self._e2e.observe(finished.e2e_seconds)

    def request_rejected(self, reason: str) -> None:
        self._rejected.labels(self._model_name, reason).inc()
