"""Continuous batching: admission, chunked prefill under a token budget, preemption by recompute."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from domain.cache.blocks import blocks_needed
from domain.cache.pool import BlockPool
from domain.cache.slots import SlotTable
from domain.contract.records import CompletionRecord
from domain.engine.sequence import Sequence, SequenceState
from domain.engine.step import SlotWork, StepPlan
from domain.overlap.pending import may_plan_ahead
from domain.speculation.choice import Proposal, lane_proposal
from domain.telemetry.step_stats import SchedulerState, SchedulerTotals


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Limits of one engine: slots, token budget per step, KV blocks and model length."""

    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    num_blocks: int
    max_model_len: int
    # Rows one scored prefill may hold (the largest scored capacity); 0: no scoring.
    scored_token_limit: int = 0
    prefix_caching: str | None = None  # the hash algorithm of the prefix cache; None: off
    kv_window: int | None = None  # ExecutorGeometry.kv_window: blocks outside it are freed

    def __post_init__(self) -> None:
        limits = (self.max_num_seqs, self.max_num_batched_tokens, self.block_size)
        if min(*limits, self.num_blocks, self.max_model_len) < 1 or self.scored_token_limit < 0:
            raise ValueError("scheduler limits must be positive, scored_token_limit at least 0")
        if blocks_needed(self.max_model_len, self.block_size) > self.num_blocks:
            raise ValueError(
                f"{self.num_blocks} KV blocks of {self.block_size} cannot hold one sequence of "
                f"max_model_len {self.max_model_len}; lower --max-model-len or raise the KV budget"
            )


class Scheduler:
    """Plans each step: running sequences first (in admission order), then admissions.

    When the KV pool runs dry the most recently admitted running sequence is preempted: it loses
    its slot and blocks and waits at the queue front to re-prefill its prompt and outputs.
    """

    def __init__(self, config: SchedulerConfig) -> None:
        self._config = config
        self._slots = SlotTable(config.max_num_seqs)
        self._blocks = BlockPool.configured(config)
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []
        self._by_slot: dict[int, Sequence] = {}
        self._scored_turn = False
        self.num_preemptions = 0

    def occupancy(self) -> SchedulerState:
        """Sequences running and waiting, and the fraction of KV blocks they hold."""
        return SchedulerState(len(self._running), len(self._waiting), self._blocks.usage)

    def totals(self) -> SchedulerTotals:
        return SchedulerTotals(self.num_preemptions, self._blocks.queries, self._blocks.hits)

    def sequence_in(self, slot: int) -> Sequence | None:
        """The sequence holding `slot`, if one does."""
        return self._by_slot.get(slot)

    def has_work(self) -> bool:
        return bool(self._waiting or self._running)

    def add(self, sequence: Sequence) -> None:
        sequence.state = SequenceState.WAITING
        self._waiting.append(sequence)

    def schedule(self, ahead: bool = False) -> StepPlan | None:
        """Builds the next step, or None when nothing can run.

        Sequences with prompt rows left to score run only in scored steps, everything else in
        ordinary ones; when both kinds have work the two alternate, so neither starves. `ahead`
        plans while a step is in flight (None when a running choice's part needs its tokens
        first, or a prompt waits to be scored): its lanes feed placeholders for the tokens in
        flight, and preempting a choice in flight drops its token, sampled again on re-prefill.
        """
        if ahead and not may_plan_ahead(self._running, self._waiting):
            return None
        kinds = (True, False) if self._scored_turn else (False, True)
        for scored in kinds:
            if scored and not self._config.scored_token_limit:
                continue
            plan = self._plan(scored)
            if plan is not None:
                self._scored_turn = not scored
                return plan
        return None

    def _plan(self, scored: bool) -> StepPlan | None:
        limit = self._config.max_num_batched_tokens
        budget = min(limit, self._config.scored_token_limit) if scored else limit
        works: list[SlotWork] = []
        # A snapshot: reserving may preempt later sequences, which then no longer run.
        for sequence in [s for s in self._running if s.needs_scoring == scored]:
            if budget <= 0:
                break
            if sequence.state is not SequenceState.RUNNING:
                continue
            cache = sequence.cache
            chunk = min(sequence.num_tokens + cache.pending - cache.num_fed, budget)
            # A choice whose tokens in flight end its budget runs no further lane.
            if chunk < 1 or cache.pending and sequence.remaining <= cache.pending:
                continue
            proposal = None if scored else lane_proposal(sequence, chunk, budget)
            # Drafts, known or still to be proposed, take cache positions and budget too.
            room = chunk + (proposal.room if proposal is not None else 0)
            if not self._reserve(sequence, room):
                break
            works.append(_work(sequence, chunk, scored, proposal))
            budget -= room
        held: list[Sequence] = []
        while self._waiting and budget > 0 and self._slots.num_free:
            sequence = self._waiting[0]
            if sequence.needs_scoring != scored:
                break  # first come, first served: the head waits for a step of its kind
            if self._awaits_sibling(sequence):
                held.append(self._waiting.popleft())  # it reads the prompt next step instead
                continue
            hits = self._blocks.match(sequence.cache.prefix, sequence.prompt, _reads(sequence))
            chunk = min(sequence.num_tokens - len(hits) * self._config.block_size, budget)
            if not self._blocks.fits(chunk, hits):
                break
            self._waiting.popleft()
            self._admit(sequence, hits)
            self._reserve(sequence, chunk)
            works.append(_work(sequence, chunk, scored))
            budget -= chunk
        self._waiting.extendleft(reversed(held))
        return StepPlan(tuple(works), scored=scored) if works else None

    def commit(
        self, records: tuple[CompletionRecord, ...]
    ) -> list[tuple[Sequence, CompletionRecord, int]]:
        """Marks the fed chunks of a completed submission as cached and returns each live lane's
        sequence with its record and lane index; stale or unknown lanes are ignored. The
        emitted tokens join the outputs through `extend`, once emission has decided which stay.
        """
        advanced = []
        for lane, record in enumerate(records):
            sequence = self._by_slot.get(record.slot)
            if sequence is None or sequence.cache.epoch != record.epoch:
                continue
            cache = sequence.cache
            if not cache.in_flight:
                continue
            # Of the drafts fed after the chunk, only the accepted ones left valid cache entries.
            cache.num_computed += cache.in_flight.pop(0)[0] + record.drafts_accepted
            cache.publish(self._blocks, sequence.tokens_between, sequence.num_tokens)
            if sequence.speculation is not None:
                offered, accepted = record.drafts_offered, record.drafts_accepted
                sequence.speculation.verified(offered, accepted, record.first_position)
            advanced.append((sequence, record, lane))
        return advanced

    def extend(self, sequence: Sequence, tokens: tuple[int, ...]) -> None:
        """Appends a record's kept tokens to the sequence's outputs (the next step feeds the
        last of them; the accepted drafts before it are already in the cache) and shows them to
        the parts that follow the outputs."""
        sequence.outputs.extend(tokens)
        for part in (sequence.speculation, sequence.thinking):
            if part is not None:
                part.observe(tokens)

    def finish(self, sequence: Sequence) -> None:
        """Ends a sequence wherever it is (never queued included), freeing slot and blocks now."""
        if sequence.state is SequenceState.RUNNING:
            self._release(sequence)
        elif sequence.state is SequenceState.WAITING and sequence in self._waiting:
            self._waiting.remove(sequence)
        sequence.state = SequenceState.FINISHED

    def _admit(self, sequence: Sequence, hits: list[int]) -> None:
        cache = sequence.cache
        cache.slot, cache.epoch = self._slots.acquire()
        cache.take(self._blocks, hits, len(sequence.prompt) if _reads(sequence) else 0)
        sequence.state = SequenceState.RUNNING
        self._by_slot[cache.slot] = sequence
        self._running.append(sequence)

    def _awaits_sibling(self, sequence: Sequence) -> bool:
        """Whether another choice of the request still computes prompt blocks this one reads."""
        end, rid = len(sequence.prompt), sequence.request_id
        waits = self._blocks.enabled and end > self._blocks.block_size and _reads(sequence)
        return waits and any(
            s.request_id == rid and s.cache.num_computed < end for s in self._running
        )

    def _reserve(self, sequence: Sequence, chunk: int) -> bool:
        """Allocates blocks for the chunk, preempting the newest sequences if needed."""
        cache = sequence.cache
        missing = blocks_needed(cache.num_fed + chunk, self._config.block_size) - len(cache.blocks)
        while missing > self._blocks.num_free:
            victim = self._running[-1]
            self._preempt(victim)
            if victim is sequence:
                return False
        if missing > 0:
            cache.blocks.extend(self._blocks.allocate(missing))
        return True

    def _preempt(self, sequence: Sequence) -> None:
        self._release(sequence)
        sequence.state = SequenceState.WAITING
        if sequence.speculation is not None:
            sequence.speculation.preempted()
        sequence.num_preemptions += 1
        self.num_preemptions += 1
        self._waiting.appendleft(sequence)

    def _release(self, sequence: Sequence) -> None:
        self._running.remove(sequence)
        cache = sequence.cache
        cache.release(self._blocks)
        if cache.slot is not None:
            del self._by_slot[cache.slot]
            self._slots.release(cache.slot)
            cache.slot = None


def _reads(sequence: Sequence) -> bool:
    """A scored prompt computes every row it scores; penalties count the prompt's fed tokens."""
    return sequence.scoring is None and not sequence.sampling.params.uses_penalties


def _work(
    sequence: Sequence, chunk: int, scored: bool, proposal: Proposal | None = None
) -> SlotWork:
    """The lane of a planned chunk: the core's tokens and sampling, and what each part adds."""
    cache, pending = sequence.cache, sequence.cache.pending
    start, end = cache.num_fed, cache.num_fed + chunk
    if cache.slot is None:
        raise ValueError(f"sequence {sequence.request_id} is planned without a slot")
    # A zero output budget (echo of a scored prompt) prefills without sampling.
    sample = end == sequence.num_tokens + pending and sequence.remaining > pending
    cache.in_flight.append((chunk, sample))
    budget, scoring = sequence.budget, sequence.scoring
    # The thinking budget's forced end replaces the lane's draw (and its verification).
    forced = budget.forced_next if sample and budget is not None else None
    # With speculation on, every decode lane verifies: proposals, or a width-one round.
    verifies = sample and chunk == 1 and not scored and forced is None
    part = sequence.speculation if verifies else None
    drafts = part.lane(proposal or Proposal(), sequence.tokens_between, end) if part else None
    if proposal is not None and proposal.drafts and drafts is None:
        raise ValueError(f"drafts planned for {sequence.request_id}, whose lane does not verify")
    constraint = sequence.constraint
    grammar = constraint.lane(len(sequence.prompt), sequence.answer_offset) if constraint else None
    return SlotWork(
        slot=cache.slot,
        epoch=cache.epoch,
        token_ids=sequence.tokens_between(start, end) + (drafts.drafts if drafts else ()),
        start_position=start,
        block_table=tuple(cache.blocks),
        prompt_len=len(sequence.prompt),
        sample=sample,
        sampling=sequence.sampling.lane(len(sequence.outputs) + pending, sample),
        prompt_targets=scoring.targets(start, chunk) if scored and scoring is not None else (),
        speculation=drafts,
        grammar=grammar,
        forced_token=forced,
    )
