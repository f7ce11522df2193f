"""The requests an engine has admitted: choices with their parts, their commits and their ends."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from domain.cache.placement import CachePlacement
from domain.common.errors import LogprobDataError
from domain.contract.frames import FrameResult, LaneFailure
from domain.contract.records import CompletionRecord
from domain.emission.channel import OutputChannel
from domain.emission.outputs import ChoiceDelta, PromptScores
from domain.emission.request_output import RequestOutput
from domain.emission.rings import ReadyRings
from domain.engine.scheduler import Scheduler
from domain.engine.sequence import Sequence
from domain.engine.step import StepPlan
from domain.logprobs.scoring import PromptScoring
from domain.logprobs.values import PositionLogprobs
from domain.requests.choice_sampling import ChoiceSampling
from domain.requests.engine_request import CheckedRequest, EngineRequest, fresh_seed
from domain.speculation.choice import ChoiceSpeculation
from domain.speculation.drafts import SpeculativeConfig
from domain.structured.constraint import OutputConstraint
from domain.telemetry.step_tally import ChoiceTimeline, StepTally

if TYPE_CHECKING:  # the domain drives ports but never needs them at run time
    from ports.grammar import CompiledGrammar
    from ports.tokenizer import Tokenizer

_log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Request:
    output: RequestOutput
    sequences: list[Sequence]
    timelines: list[ChoiceTimeline]  # one per choice: where its latencies are measured from
    # Choices held back until choice 0 scored the prompt: outputs follow the prompt's scores.
    deferred: list[Sequence] = field(default_factory=list)
    # The compiled constraint its check made, held (never read) while the request lives, so
    # that the compiler keeps finding it for the executor however busy its cache is.
    grammar: CompiledGrammar | None = None


class AdmittedRequests:
    """The admitted requests of one engine, touched by its thread only: each choice becomes a
    sequence with a part for each feature it uses, each committed record goes through its
    choice's output, and a request ends once every choice has, or at once when it fails."""

    def __init__(
        self,
        scheduler: Scheduler,
        tally: StepTally,
        tokenizer: Tokenizer,
        max_model_len: int,
        speculative: SpeculativeConfig | None,
    ) -> None:
        self._scheduler = scheduler
        self._tally = tally
        self._tokenizer = tokenizer
        self._max_model_len = max_model_len
        self._speculative = speculative
        self._running: dict[str, _Request] = {}
        self.rings = ReadyRings()  # held by the engine through each step

    def admit(self, checked: CheckedRequest, channel: OutputChannel, arrived: float) -> None:
        request = checked.request
        channel.ring_through(self.rings)
        output = RequestOutput(request, channel, self._tokenizer)
        if request.request_id in self._running:
            output.close(f"request ID {request.request_id} is already running")
            return
        fallback = fresh_seed()
        sequences = [self._sequence(request, index, fallback) for index in range(request.n)]
        timelines = [ChoiceTimeline(arrived) for _ in sequences]
        entry = _Request(output, sequences, timelines, grammar=checked.grammar)
        self._running[request.request_id] = entry
        if sequences[0].needs_scoring:
            entry.deferred = sequences[1:]
            sequences = sequences[:1]
        for sequence in sequences:
            self._scheduler.add(sequence)

    def _sequence(self, request: EngineRequest, index: int, fallback_seed: int) -> Sequence:
        """Choice `index` of an admitted request, with a part for each feature it uses."""
        prompt, eos = request.prompt_token_ids, self._tokenizer.eos_token_ids
        sampling = ChoiceSampling.admit(request, index, fallback_seed, eos, self._max_model_len)
        speculative = self._speculative
        return Sequence(
            request.request_id,
            index,
            prompt,
            sampling,
            speculation=ChoiceSpeculation(speculative) if speculative is not None else None,
            thinking=request.thinking.tracker(prompt) if request.thinking is not None else None,
            constraint=OutputConstraint(request.grammar) if request.grammar is not None else None,
            # One choice scores the prompt; the scores belong to the request, not a choice.
            scoring=PromptScoring(prompt) if request.score_prompt and index == 0 else None,
            cache=CachePlacement.salted(request.cache_salt),
        )

    def _owner(self, slot: int, epoch: int | None = None) -> tuple[Sequence, _Request] | None:
        """The sequence in `slot` (at `epoch`, when given) with its request, if both live."""
        sequence = self._scheduler.sequence_in(slot)
        if sequence is None or epoch is not None and sequence.cache.epoch != epoch:
            return None
        entry = self._running.get(sequence.request_id)
        return None if entry is None else (sequence, entry)

    def scheduled(self, plan: StepPlan) -> None:
        """Queue times of choices scheduled for the first time (the tally keeps the first)."""
        for work in plan.works:
            if (owner := self._owner(work.slot)) is not None:
                self._tally.scheduled(owner[1].timelines[owner[0].index])

    def fail_plan(self, plan: StepPlan, error: Exception) -> None:
        """Fails every request with a lane in a step that failed as a whole (logs the error)."""
        _log.exception("step failed")
        message = f"the model step failed: {error}"
        owners = (self._owner(work.slot) for work in plan.works)
        for entry in {owner[1] for owner in owners if owner is not None}:
            self._end(entry, "error", message)

    def retire(self, failures: tuple[LaneFailure, ...]) -> None:
        """Fails the requests of the lanes the executor retired, each with its message, before
        the frame commits: the commit passes their freed slots' records by, the rest go on."""
        for failure in failures:
            if (owner := self._owner(failure.slot, failure.epoch)) is not None:
                self._end(owner[1], "error", failure.message, failure.param)

    def commit(self, sequence: Sequence, result: FrameResult, lane: int, scored: bool) -> None:
        """Takes one committed lane's record, and a scored lane's prompt scores, in."""
        if (entry := self._running.get(sequence.request_id)) is None:
            return
        record = result.records[lane]
        self._tally.speculated(record.drafts_offered, record.drafts_accepted)
        if scored and not self._publish_scores(entry, sequence, result, lane):
            return
        if record.emits:
            self._emit(entry, sequence, record, result.lane_logprobs(lane))
        elif sequence.remaining < 1 and sequence.prefill_done:
            # A prefill-only choice (echo with nothing to generate) ends with its prompt.
            self._tally.output(entry.timelines[sequence.index], 0, len(sequence.prompt))
            self._deliver(entry, sequence, entry.output.end(sequence.index))

    def _publish_scores(
        self, entry: _Request, sequence: Sequence, result: FrameResult, lane: int
    ) -> bool:
        """Puts a scored lane's new prompt scores out; False when that failed the request."""
        if (scoring := sequence.scoring) is None:
            return True
        rows = result.prompt_scores[lane] if lane < len(result.prompt_scores) else None
        try:
            first, fresh = scoring.publish(result.records[lane].first_position, rows)
        except LogprobDataError as error:
            self._end(entry, "error", str(error))
            return False
        if fresh:
            entry.output.deliver(PromptScores(first, fresh))
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
            entry.output.deliver(entry.output.end(sequence.index))
            self._tally.finished(entry.timelines[sequence.index], "length")
        if deferred and entry.output.done:
            self._close(entry)

    def _emit(
        self,
        entry: _Request,
        sequence: Sequence,
        record: CompletionRecord,
        payload: tuple[PositionLogprobs, ...] | None,
    ) -> None:
        """Runs the record through the choice's emission; its kept tokens become outputs."""
        timeline = entry.timelines[sequence.index]
        self._tally.output(timeline, len(record.tokens), len(sequence.prompt))
        try:
            delta = entry.output.advance(sequence.index, record, payload)
        except LogprobDataError as error:
            self._end(entry, "error", str(error))
            return
        except Exception as error:  # noqa: BLE001 - one broken request must not stop the engine
            _log.exception("emission failed")
            self._end(entry, "error", f"output processing failed: {error}")
            return
        self._scheduler.extend(sequence, delta.token_ids)
        self._deliver(entry, sequence, delta)

    def _deliver(self, entry: _Request, sequence: Sequence, delta: ChoiceDelta) -> None:
        if delta.finished:
            self._scheduler.finish(sequence)
            self._tally.finished(entry.timelines[sequence.index], delta.finish_reason or "stop")
        entry.output.deliver(delta)
        if entry.output.done:
            self._close(entry)

    def abort(self, request_id: str) -> None:
        if (entry := self._running.get(request_id)) is not None:
            self._end(entry, "abort")

    def _end(
        self, entry: _Request, reason: str, error: str | None = None, param: str | None = None
    ) -> None:
        """Ends every unfinished choice with `reason` and closes the request: an abort tells each
        choice's consumer; a failure says `error` (`param`: the input at fault) in its end only."""
        entry.deferred = []
        for index in entry.output.stop(reason, tell=error is None):
            self._scheduler.finish(entry.sequences[index])
            self._tally.finished(entry.timelines[index], reason)
        self._close(entry, error, param)

    def _close(self, entry: _Request, error: str | None = None, param: str | None = None) -> None:
        self._running.pop(entry.output.request.request_id, None)
        entry.output.close(error, param, entry.sequences[0].cache.cached_tokens or 0)
