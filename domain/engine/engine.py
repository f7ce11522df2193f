"""The engine use case: admits requests, runs steps through the executor, emits choice deltas."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from domain.common.errors import InvalidRequestError, LogprobDataError, OverloadedError
from domain.contract.records import CompletionRecord
from domain.emission.choice import ChoiceEmission
from domain.emission.outputs import ChoiceDelta, PromptScores, RequestEnd, Usage
from domain.engine.channel import OutputChannel
from domain.engine.commit import min_tokens_ban, stop_token_ids
from domain.engine.scheduler import Scheduler, SchedulerConfig
from domain.engine.sequence import Sequence
from domain.engine.step import FrameResult, LaneFailure, StepPlan
from domain.engine.step_stats import SchedulerState, UnobservedSteps
from domain.engine.step_tally import ChoiceTimeline, StepTally
from domain.logprobs.prompt_scores import new_prompt_scores
from domain.logprobs.rules import LogprobLimits, check_logprob_ask
from domain.logprobs.values import PositionLogprobs
from domain.requests.engine_request import CheckedRequest, EngineRequest, fresh_seed
from domain.speculation.drafts import SpeculativeConfig

if TYPE_CHECKING:  # the domain drives ports but never needs them at run time
    from ports.executor import ModelExecutor
    from ports.grammar import CompiledGrammar, GrammarCompiler
    from ports.metrics import EngineObserver
    from ports.tokenizer import Tokenizer

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Engine limits beyond the executor's geometry."""

    max_num_seqs: int | None = None
    max_num_batched_tokens: int = 512
    max_waiting: int = 1024
    channel_capacity: int = 64
    max_logprobs: int = 20
    speculative: SpeculativeConfig | None = None


@dataclass(eq=False)
class _Request:
    request: EngineRequest
    channel: OutputChannel
    choices: list[ChoiceEmission]
    sequences: list[Sequence]
    # Choices held back until choice 0 has scored the prompt, so every choice's first output
    # comes after the whole prompt's scores.
    deferred: list[Sequence] = field(default_factory=list)
    # One per choice, set once the request is admitted: where its latencies are measured from.
    timelines: list[ChoiceTimeline] = field(default_factory=list)
    # The compiled constraint its check made, held (never read) while the request lives, so
    # that the compiler keeps finding it for the executor however busy its cache is.
    grammar: CompiledGrammar | None = None

    @property
    def done(self) -> bool:
        return all(choice.finished for choice in self.choices)

    def usage(self) -> Usage:
        return Usage(len(self.request.prompt_token_ids), sum(c.num_tokens for c in self.choices))


class Engine:
    """Drives one executor; `submit` and `abort` may come from any thread, `step` from one.

    After every step that changed anything the observer gets one StepStats; `clock` (seconds,
    monotonic) times the latencies in it.
    """

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
        self._config = config or EngineConfig()
        self._observer = observer or UnobservedSteps()
        self._clock = clock
        self._tally = StepTally()
        geometry = executor.geometry
        if self._config.speculative is not None:
            self._config.speculative.check_token_capacity(geometry.token_capacity)
        self._executor = executor
        self._tokenizer = tokenizer
        self._grammars = grammars
        self.max_model_len = geometry.max_model_len
        self.vocab_size = geometry.vocab_size
        self.logprob_limits = LogprobLimits(
            top_k=geometry.logprob_top_k,
            selects_ids=geometry.selects_logprob_ids,
            scores_prompts=geometry.scores_prompts,
            max_logprobs=self._config.max_logprobs,
            vocab_size=geometry.vocab_size,
        )
        self._scheduler = Scheduler(
            SchedulerConfig(
                max_num_seqs=min(self._config.max_num_seqs or geometry.capacity, geometry.capacity),
                max_num_batched_tokens=self._config.max_num_batched_tokens,
                block_size=geometry.block_size,
                num_blocks=geometry.num_blocks,
                max_model_len=geometry.max_model_len,
                scored_token_limit=geometry.scored_token_limit,
                speculative=self._config.speculative,
            )
        )
        self._requests: dict[str, _Request] = {}
        # Submissions (with their arrival times), and request IDs to abort, in arrival order.
        self._inbox: deque[tuple[CheckedRequest, OutputChannel, float] | str] = deque()
        self._wake = threading.Condition()
        self._arrivals = itertools.count()

    @property
    def scheduler(self) -> Scheduler:
        return self._scheduler

    @property
    def logprob_top_k(self) -> int:
        return self.logprob_limits.top_k

    def check(self, request: EngineRequest) -> CheckedRequest:
        """Raises InvalidRequestError for a request this engine cannot take; admits nothing.

        A grammar is compiled here, which blocks for up to the compiler's budget: callers on
        an event loop run this on a thread."""
        request.check_limits(self.vocab_size, self.max_model_len)
        check_logprob_ask(request.logprobs, self.logprob_limits)
        if request.grammar is not None:
            if self._grammars is None:
                raise InvalidRequestError(
                    "structured outputs need a grammar engine, and this server has none",
                    param=request.grammar.param,
                )
            return CheckedRequest(request, self, self._grammars.compile(request.grammar))
        return CheckedRequest(request, self)

    def submit(self, request: EngineRequest, channel: OutputChannel | None = None) -> OutputChannel:
        """Checks and queues one request; raises InvalidRequestError before admission."""
        if channel is None:
            channel = OutputChannel(self._config.channel_capacity)
        self.submit_all([(self.check(request), channel)])
        return channel

    def submit_all(self, submissions: list[tuple[CheckedRequest, OutputChannel]]) -> None:
        """Queues requests this engine checked, all of them or (when the queue is full) none."""
        if any(checked.issuer is not self for checked, _ in submissions):
            raise ValueError("only requests this engine checked can be submitted to it")
        with self._wake:
            waiting = len(self._inbox) + self._scheduler.num_waiting
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
            return bool(self._inbox) or self._scheduler.has_work()

    def wait_for_work(self, timeout: float) -> None:
        with self._wake:
            if not self._inbox and not self._scheduler.has_work():
                self._wake.wait(timeout)

    def step(self) -> None:
        """Admits queued requests and runs one step of the model, if any lane can run."""
        try:
            self._step()
        finally:
            self._report()

    def _step(self) -> None:
        self._drain_inbox()
        plan = self._scheduler.schedule()
        if plan is None:
            return
        self._note_admissions(plan)
        try:
            result = self._executor.read(self._executor.submit(plan))
        except Exception as error:  # noqa: BLE001 - the step's requests fail, the engine goes on
            _log.exception("step failed")
            owners = (self._owner(work.slot) for work in plan.works)
            for failed in {owner for owner in owners if owner is not None}:
                self._fail(failed, f"the model step failed: {error}")
            return
        self._note_frame(result)
        self._retire(result.failures)
        for sequence, record, lane in self._scheduler.commit(result.records):
            entry = self._requests.get(sequence.request_id)
            if entry is None:
                continue
            self._tally.speculated(record.drafts_offered, record.drafts_accepted)
            if plan.scored and not self._publish_scores(entry, sequence, record, result, lane):
                continue
            if record.emits:
                self._emit(entry, sequence, record, result.lane_logprobs(lane))
            elif sequence.remaining < 1 and sequence.prefill_done:
                # A prefill-only choice (echo with nothing to generate) ends with its prompt.
                self._note_output(entry, sequence, 0)
                self._deliver(entry, sequence, entry.choices[sequence.index].end())

    def _retire(self, failures: tuple[LaneFailure, ...]) -> None:
        """Fails the requests of the lanes the executor retired, each with its own message,
        before the frame commits: their slots are free, so the commit passes their records
        by, and the frame's other lanes go on."""
        for failure in failures:
            sequence = self._scheduler.sequence_in(failure.slot)
            if sequence is None or sequence.epoch != failure.epoch:
                continue
            entry = self._requests.get(sequence.request_id)
            if entry is not None:
                self._fail(entry, failure.message, param=failure.param)

    def _note_admissions(self, plan: StepPlan) -> None:
        """Queue times of choices scheduled for the first time (a chunk at position 0)."""
        now = self._clock()
        for work in plan.works:
            if work.start_position:
                continue
            sequence = self._scheduler.sequence_in(work.slot)
            entry = self._requests.get(sequence.request_id) if sequence is not None else None
            if sequence is not None and entry is not None and entry.timelines:
                self._tally.scheduled(entry.timelines[sequence.index], now)

    def _note_frame(self, result: FrameResult) -> None:
        positions = sum(len(lane) for lane in result.logprobs if lane is not None)
        rows = sum(1 for lane in result.prompt_scores for row in lane if row is not None)
        self._tally.frame_read(positions, result.payload_bytes, rows)

    def _report(self) -> None:
        """Hands the tally to the observer; a failing observer never stops the engine."""
        scheduler = self._scheduler
        state = SchedulerState(
            scheduler.num_running, scheduler.num_waiting, scheduler.kv_cache_usage
        )
        stats = self._tally.flush(state, scheduler.num_preemptions)
        if stats is None:
            return
        try:
            self._observer.record_step(stats)
        except Exception:  # noqa: BLE001 - metrics are never worth a request
            _log.exception("the engine observer failed")

    def _note_output(self, entry: _Request, sequence: Sequence, tokens: int) -> None:
        """A choice's output (its first counts its prompt): token counts and latencies."""
        if entry.timelines:
            timeline = entry.timelines[sequence.index]
            self._tally.output(timeline, self._clock(), tokens, len(sequence.prompt))

    def _finished(self, entry: _Request, index: int, reason: str) -> None:
        if entry.timelines:
            self._tally.finished(entry.timelines[index], reason, self._clock())

    def _publish_scores(
        self,
        entry: _Request,
        sequence: Sequence,
        record: CompletionRecord,
        result: FrameResult,
        lane: int,
    ) -> bool:
        """Puts the lane's new prompt scores on the channel; False when the request failed."""
        rows = result.prompt_scores[lane] if lane < len(result.prompt_scores) else None
        chunk_start = record.first_position - (len(rows) if rows is not None else 0)
        try:
            fresh = new_prompt_scores(sequence.prompt, sequence.scored_rows, chunk_start, rows)
        except LogprobDataError as error:
            self._fail(entry, str(error))
            return False
        if fresh:
            entry.channel.put(PromptScores(sequence.scored_rows + 1, fresh))
            sequence.scored_rows += len(fresh)
        if not sequence.needs_scoring:
            self._release_deferred(entry)
        return True

    def _release_deferred(self, entry: _Request) -> None:
        """Starts the held-back choices; with nothing to generate they end at once."""
        deferred, entry.deferred = entry.deferred, []
        for sequence in deferred:
            if sequence.remaining > 0:
                self._scheduler.add(sequence)
                continue
            self._scheduler.finish(sequence)
            entry.channel.put(entry.choices[sequence.index].end())
            self._finished(entry, sequence.index, "length")
        if deferred and entry.done:
            self._close(entry)

    def _owner(self, slot: int) -> _Request | None:
        for entry in self._requests.values():
            if any(sequence.slot == slot for sequence in entry.sequences):
                return entry
        return None

    def _emit(
        self,
        entry: _Request,
        sequence: Sequence,
        record: CompletionRecord,
        payload: tuple[PositionLogprobs, ...] | None,
    ) -> None:
        """Runs the record through the choice's emission machine; the kept tokens become the
        sequence's outputs."""
        self._note_output(entry, sequence, len(record.tokens))
        try:
            delta = entry.choices[sequence.index].advance(record, payload)
        except LogprobDataError as error:
            self._fail(entry, str(error))
            return
        except Exception as error:  # noqa: BLE001 - one broken request must not stop the engine
            _log.exception("emission failed")
            self._fail(entry, f"output processing failed: {error}")
            return
        self._scheduler.extend(sequence, delta.token_ids)
        self._deliver(entry, sequence, delta)

    def _deliver(self, entry: _Request, sequence: Sequence, delta: ChoiceDelta) -> None:
        if delta.finished:
            self._scheduler.finish(sequence)
            self._finished(entry, sequence.index, delta.finish_reason or "stop")
        if delta.text or delta.token_ids or delta.finished or delta.logprobs:
            entry.channel.put(delta)
        if entry.done:
            self._close(entry)

    def _drain_inbox(self) -> None:
        with self._wake:
            messages = list(self._inbox)
            self._inbox.clear()
        for message in messages:
            if isinstance(message, str):
                self._abort(message)
                continue
            checked, channel, arrived = message
            self._admit(checked, channel)
            self._start_timelines(checked.request, arrived)

    def _admit(self, checked: CheckedRequest, channel: OutputChannel) -> None:
        request = checked.request
        if request.request_id in self._requests:
            channel.put(
                RequestEnd(
                    Usage(len(request.prompt_token_ids), 0),
                    error=f"request ID {request.request_id} is already running",
                )
            )
            return
        fallback = fresh_seed()
        prompt_len = len(request.prompt_token_ids)
        params = request.params
        limit = self.max_model_len - prompt_len
        max_tokens = limit if params.max_tokens is None else min(params.max_tokens, limit)
        if request.prefill_only:
            max_tokens = 0
        eos = self._tokenizer.eos_token_ids
        constrained = request.grammar is not None
        sequences = [
            Sequence(
                request_id=request.request_id,
                index=index,
                prompt=request.prompt_token_ids,
                params=params,
                seed=request.choice_seed(index, fallback),
                max_tokens=max_tokens,
                stop_token_ids=stop_token_ids(params, eos, constrained=constrained),
                banned_until_min_tokens=min_tokens_ban(params, eos, constrained=constrained),
                arrival=next(self._arrivals),
                logprobs=request.options,
                # One choice scores the prompt; the scores belong to the request, not a choice.
                score_prompt=request.score_prompt and index == 0,
                grammar=request.grammar,
                thinking=(
                    request.thinking.tracker(request.prompt_token_ids)
                    if request.thinking is not None
                    else None
                ),
            )
            for index in range(request.n)
        ]
        wants_logprobs = request.options is not None
        echo = request.logprobs.echoes
        choices = [
            ChoiceEmission(index, params, self._tokenizer, logprobs=wants_logprobs, echo=echo)
            for index in range(request.n)
        ]
        entry = _Request(request, channel, choices, sequences, grammar=checked.grammar)
        self._requests[request.request_id] = entry
        if sequences[0].needs_scoring:
            entry.deferred = sequences[1:]
            sequences = sequences[:1]
        for sequence in sequences:
            self._scheduler.add(sequence)

    def _start_timelines(self, request: EngineRequest, arrived: float) -> None:
        entry = self._requests.get(request.request_id)
        if entry is not None and entry.request is request:
            entry.timelines = [ChoiceTimeline(arrived) for _ in entry.choices]

    def _abort(self, request_id: str) -> None:
        entry = self._requests.get(request_id)
        if entry is None:
            return
        entry.deferred = []
        for sequence, choice in zip(entry.sequences, entry.choices, strict=True):
            if not choice.finished:
                self._scheduler.finish(sequence)
                entry.channel.put(choice.abort("abort"))
                self._finished(entry, sequence.index, "abort")
        self._close(entry)

    def _fail(self, entry: _Request, message: str, *, param: str | None = None) -> None:
        """Ends the request with `message`; `param` marks the failure as its own input's."""
        entry.deferred = []
        for sequence, choice in zip(entry.sequences, entry.choices, strict=True):
            if not choice.finished:
                self._scheduler.finish(sequence)
                choice.abort("error")
                self._finished(entry, sequence.index, "error")
        self._close(entry, error=message, param=param)

    def _close(
        self, entry: _Request, *, error: str | None = None, param: str | None = None
    ) -> None:
        self._requests.pop(entry.request.request_id, None)
        entry.channel.put(RequestEnd(entry.usage(), error=error, error_param=param))


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
