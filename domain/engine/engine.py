"""The engine use case: admits requests, runs steps through the executor, emits choice deltas."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from domain.common.errors import OverloadedError
from domain.emission.channel import OutputChannel
from domain.engine.admitted import AdmittedRequests
from domain.engine.scheduler import Scheduler, SchedulerConfig
from domain.engine.step import StepPlan
from domain.requests.engine_request import CheckedRequest, EngineRequest
from domain.speculation.drafts import SpeculativeConfig
from domain.telemetry.step_tally import StepTally

if TYPE_CHECKING:  # the domain drives ports but never needs them at run time
    from ports.executor import ModelExecutor
    from ports.grammar import GrammarCompiler
    from ports.metrics import EngineObserver
    from ports.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Engine limits beyond the executor's geometry."""

    max_num_seqs: int | None = None
    max_num_batched_tokens: int = 512
    max_waiting: int = 1024
    channel_capacity: int = 64
    max_logprobs: int = 20
    speculative: SpeculativeConfig | None = None
    async_scheduling: bool = False  # vLLM's async scheduling: see Engine
    prefix_caching: str | None = "sha256"  # its hash algorithm (domain.cache.pool); None: off
    # At most one observer report this often while busy (domain.telemetry.step_tally); 0: a step
    metrics_interval_s: float = 0.0


class Engine:
    """Drives one executor; `submit` and `abort` may come from any thread, `step` from one.

    After every step that changed anything the observer gets one StepStats (with
    `metrics_interval_s`, one an interval while busy, and one as it goes idle); `clock`
    (seconds, monotonic) times the latencies in it. With `async_scheduling` a step submits the
    next plan before it reads the one in flight, so a background executor works while the host
    emits (`docs/serving-paths.md`); steps a feature needs synchronous read first and plan
    after.
    """

    submit_waits = False  # submit_all queues here, in this process (ports.engine_client)

    def __init__(
        self,
        executor: ModelExecutor,
        tokenizer: Tokenizer,
        config: EngineConfig | None = None,
        *,
        observer: EngineObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
        grammars: GrammarCompiler | None = None,
    ) -> None:
        self._config = config = config or EngineConfig()
        self._clock = clock
        self._tally = StepTally(observer, clock, config.metrics_interval_s)
        geometry = executor.geometry
        if config.speculative is not None:
            config.speculative.check_token_capacity(geometry.token_capacity)
        self._executor = executor
        self._grammars = grammars
        self.max_model_len = geometry.max_model_len
        self.vocab_size = geometry.vocab_size
        self.logprob_limits = geometry.logprobs.limits(config.max_logprobs, geometry.vocab_size)
        self._scheduler = Scheduler(
            SchedulerConfig(
                max_num_seqs=min(config.max_num_seqs or geometry.capacity, geometry.capacity),
                max_num_batched_tokens=config.max_num_batched_tokens,
                block_size=geometry.block_size,
                num_blocks=geometry.num_blocks,
                max_model_len=geometry.max_model_len,
                scored_token_limit=geometry.logprobs.scored_rows,
                prefix_caching=config.prefix_caching,
                kv_window=geometry.kv_window,
            )
        )
        self._requests = AdmittedRequests(
            self._scheduler, self._tally, tokenizer, self.max_model_len, config.speculative
        )
        # Submissions (with their arrival times), and request IDs to abort, in arrival order.
        self._inbox: deque[tuple[CheckedRequest, OutputChannel, float] | str] = deque()
        self._wake = threading.Condition()
        self._in_flight: tuple[StepPlan, int] | None = None

    @property
    def logprob_top_k(self) -> int:
        return self.logprob_limits.top_k

    def check(self, request: EngineRequest) -> CheckedRequest:
        """Raises InvalidRequestError for a request this engine cannot take; admits nothing. A
        grammar compiles here, for up to its budget: event-loop callers run this on a thread."""
        limits, grammars = self.logprob_limits, self._grammars
        return CheckedRequest.check(request, self, limits, self.max_model_len, grammars)

    def submit(self, request: EngineRequest, channel: OutputChannel | None = None) -> OutputChannel:
        """Checks and queues one request; raises InvalidRequestError before admission."""
        channel = OutputChannel(self._config.channel_capacity) if channel is None else channel
        self.submit_all([(self.check(request), channel)])
        return channel

    def submit_all(self, submissions: list[tuple[CheckedRequest, OutputChannel]]) -> None:
        """Queues requests this engine checked, all of them or (when the queue is full) none."""
        if any(checked.issuer is not self for checked, _ in submissions):
            raise ValueError("only requests this engine checked can be submitted to it")
        with self._wake:
            waiting = len(self._inbox) + self._scheduler.occupancy().waiting
            if waiting + len(submissions) > self._config.max_waiting:
                raise OverloadedError("the server is at its admission limit; retry later")
            arrived = self._clock()
            for checked, channel in submissions:
                self._inbox.append((checked, channel, arrived))
            self._wake.notify()

    def abort(self, request_id: str) -> None:
        with self._wake:
            self._inbox.append(request_id)
            self._wake.notify()

    def has_work(self) -> bool:
        with self._wake:
            return bool(self._inbox) or self._scheduler.has_work() or bool(self._in_flight)

    def wait_for_work(self, timeout: float) -> None:
        with self._wake:
            if not self._inbox and not self._scheduler.has_work() and not self._in_flight:
                self._wake.wait(timeout)

    def step(self) -> None:
        """Admits queued requests and runs one step of the model, if any lane can run."""
        try:
            with self._requests.rings:
                self._step()
        finally:
            idle = self._in_flight is None and not self._scheduler.has_work()
            self._tally.report(self._scheduler.occupancy(), self._scheduler.totals(), idle=idle)

    def _step(self) -> None:
        with self._wake:
            messages, self._inbox = self._inbox, deque()
        for message in messages:
            if isinstance(message, str):
                self._requests.abort(message)
            else:
                self._requests.admit(*message)
        # Taken only once planning worked: a step that raises leaves it in flight to land next.
        landing = self._in_flight
        plan = self._scheduler.schedule(ahead=landing is not None)
        self._in_flight = None
        if plan is not None:
            self._requests.scheduled(plan)
            try:
                self._in_flight = (plan, self._executor.submit(plan))
            except Exception as error:  # noqa: BLE001 - the step's requests fail, the engine goes on
                self._requests.fail_plan(plan, error)
        if landing is None and not self._config.async_scheduling:
            landing, self._in_flight = self._in_flight, None
        if landing is not None:
            self._land(*landing)

    def _land(self, plan: StepPlan, frame: int) -> None:
        """Reads a submitted step and commits what its lanes emitted."""
        try:
            result = self._executor.read(frame)
        except Exception as error:  # noqa: BLE001 - the step's requests fail, the engine goes on
            self._requests.fail_plan(plan, error)
            return
        self._tally.frame_read(result.positions, result.payload_bytes, result.scored_rows)
        self._requests.retire(result.failures)
        for sequence, _, lane in self._scheduler.commit(result.records):
            self._requests.commit(sequence, result, lane, plan.scored)
