"""Continuous batching: admission, chunked prefill under a token budget, preemption by recompute."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from domain.contract.records import CompletionRecord, Role
from domain.engine.blocks import BlockAllocator, blocks_needed
from domain.engine.sequence import Sequence, SequenceState
from domain.engine.slots import SlotTable
from domain.engine.step import SlotWork, StepPlan
from domain.logprobs.prompt_scores import prompt_targets
from domain.logprobs.values import NO_TOKEN
from domain.speculation.drafts import (
    NgramProposer,
    SpeculativeConfig,
    SpeculativeMethod,
    next_draft_limit,
)


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
    # Decode lanes verify proposals (history n-grams) when set.
    speculative: SpeculativeConfig | None = None

    def __post_init__(self) -> None:
        if (
            min(
                self.max_num_seqs,
                self.max_num_batched_tokens,
                self.block_size,
                self.num_blocks,
                self.max_model_len,
            )
            < 1
        ):
            raise ValueError("scheduler limits must be positive")
        if self.scored_token_limit < 0:
            raise ValueError("scored_token_limit must be non-negative")
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
        self._blocks = BlockAllocator(config.num_blocks)
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []
        self._by_slot: dict[int, Sequence] = {}
        self._scored_turn = False
        self._preemptions = 0

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_free_blocks(self) -> int:
        return self._blocks.num_free

    @property
    def num_free_slots(self) -> int:
        return self._slots.num_free

    @property
    def num_preemptions(self) -> int:
        """Preemptions since the scheduler started."""
        return self._preemptions

    @property
    def kv_cache_usage(self) -> float:
        """The fraction of KV blocks held by sequences, 0 to 1."""
        total = self._config.num_blocks
        return (total - self._blocks.num_free) / total

    def sequence_in(self, slot: int) -> Sequence | None:
        """The sequence holding `slot`, if one does."""
        return self._by_slot.get(slot)

    def has_work(self) -> bool:
        return bool(self._waiting or self._running)

    def add(self, sequence: Sequence) -> None:
        sequence.state = SequenceState.WAITING
        self._waiting.append(sequence)

    def schedule(self) -> StepPlan | None:
        """Builds the next step, or None when nothing can run.

        Sequences with prompt rows left to score run only in scored steps, everything else in
        ordinary ones; when both kinds have work the two alternate, so neither starves.
        """
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
        budget = self._config.max_num_batched_tokens
        if scored:
            budget = min(budget, self._config.scored_token_limit)
        works: list[SlotWork] = []
        # A snapshot: reserving may preempt later sequences, which then no longer run.
        for sequence in [s for s in self._running if s.needs_scoring == scored]:
            if budget <= 0:
                break
            if sequence.state is not SequenceState.RUNNING:
                continue
            chunk = min(sequence.num_tokens - sequence.num_computed, budget)
            if chunk < 1:
                continue
            sequence.pending_proposals = 0
            drafts = () if scored else self._drafts(sequence, chunk, budget)
            # Drafts, known or still to be proposed, take cache positions and budget too.
            room = chunk + len(drafts) + sequence.pending_proposals
            if not self._reserve(sequence, room):
                break
            works.append(self._work(sequence, chunk, scored, drafts))
            budget -= room
        while self._waiting and budget > 0 and self._slots.num_free:
            sequence = self._waiting[0]
            if sequence.needs_scoring != scored:
                break  # first come, first served: the head waits for a step of its kind
            chunk = min(sequence.num_tokens, budget)
            if blocks_needed(chunk, self._config.block_size) > self._blocks.num_free:
                break
            self._waiting.popleft()
            self._admit(sequence)
            self._reserve(sequence, chunk)
            works.append(self._work(sequence, chunk, scored))
            budget -= chunk
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
            if sequence is None or sequence.epoch != record.epoch or not sequence.in_flight:
                continue
            # Of the drafts fed after the chunk, only the accepted ones left valid cache entries.
            sequence.num_computed += sequence.in_flight + record.drafts_accepted
            if record.role is Role.SPECULATIVE and sequence.draft_model and record.drafts_offered:
                # The draft model fed the lane's last token and every draft but the last.
                kept = min(record.drafts_accepted, record.drafts_offered - 1)
                sequence.draft_computed = record.first_position + kept
            if record.drafts_offered:
                sequence.draft_limit = next_draft_limit(
                    sequence.draft_limit, record.drafts_offered, record.drafts_accepted
                )
            sequence.in_flight = 0
            advanced.append((sequence, record, lane))
        return advanced

    def extend(self, sequence: Sequence, tokens: tuple[int, ...]) -> None:
        """Appends a record's kept tokens to the sequence's outputs (the next step feeds the
        last of them; the accepted drafts before it are already in the cache)."""
        sequence.outputs.extend(tokens)
        if sequence.proposer is not None:
            sequence.proposer.extend(tokens)
        if sequence.thinking is not None:
            sequence.thinking.observe(tokens)

    def _draft_limit(self, sequence: Sequence, chunk: int, budget: int) -> int:
        """Drafts a decode lane may carry: up to k (fewer after rejections, see
        `next_draft_limit`), within the token budget and one short of the remaining output
        budget (a round also emits the target's own token); none before `min_tokens` are out,
        whose bans a width-one round applies, and none past the thinking budget."""
        speculative = self._config.speculative
        decoding = chunk == 1 and sequence.num_computed + 1 == sequence.num_tokens
        if speculative is None or not decoding:
            return 0
        if len(sequence.outputs) < sequence.params.min_tokens:
            return 0
        k = speculative.num_speculative_tokens
        limit = min(k, sequence.draft_limit or k, sequence.remaining - 1, budget - 1)
        room = sequence.thinking_room
        if room is not None:
            # Drafts are cut so that no round runs past a token the thinking budget forces;
            # a lane with a forced token pending does not speculate at all (room 0).
            limit = min(limit, room - 1)
        if sequence.awaits_grammar:
            # A draft past the reasoning's end would emit answer tokens the grammar never saw.
            return 0
        return max(0, limit)

    def _drafts(self, sequence: Sequence, chunk: int, budget: int) -> tuple[int, ...]:
        """The lane's history proposals (ngram); for a draft-model lane it only sets how many
        drafts its executor proposes (`pending_proposals`), which reserve room like drafts."""
        speculative = self._config.speculative
        limit = self._draft_limit(sequence, chunk, budget)
        sequence.pending_proposals = 0
        if speculative is None or limit < 1:
            return ()
        if speculative.method is SpeculativeMethod.DRAFT_MODEL:
            sequence.draft_model = True
            sequence.pending_proposals = limit
            return ()
        if sequence.proposer is None:
            sequence.proposer = NgramProposer(
                speculative.prompt_lookup_min,
                speculative.prompt_lookup_max,
                sequence.prompt + tuple(sequence.outputs),
            )
        return sequence.proposer.propose(limit)

    def finish(self, sequence: Sequence) -> None:
        """Ends a sequence wherever it is (never queued included) and frees its slot and blocks
        at once."""
        if sequence.state is SequenceState.RUNNING:
            self._running.remove(sequence)
            self._release(sequence)
        elif sequence.state is SequenceState.WAITING and sequence in self._waiting:
            self._waiting.remove(sequence)
        sequence.state = SequenceState.FINISHED

    def _admit(self, sequence: Sequence) -> None:
        sequence.slot, sequence.epoch = self._slots.acquire()
        sequence.state = SequenceState.RUNNING
        sequence.num_computed = 0
        self._by_slot[sequence.slot] = sequence
        self._running.append(sequence)

    def _reserve(self, sequence: Sequence, chunk: int) -> bool:
        """Allocates blocks for the chunk, preempting the newest sequences if needed."""
        needed = blocks_needed(sequence.num_computed + chunk, self._config.block_size)
        missing = needed - len(sequence.blocks)
        while missing > self._blocks.num_free:
            victim = self._running[-1]
            self._preempt(victim)
            if victim is sequence:
                return False
        if missing > 0:
            sequence.blocks.extend(self._blocks.allocate(missing))
        return True

    def _preempt(self, sequence: Sequence) -> None:
        self._running.remove(sequence)
        self._release(sequence)
        sequence.state = SequenceState.WAITING
        sequence.num_computed = 0
        sequence.draft_computed = 0
        sequence.num_preemptions += 1
        self._preemptions += 1
        self._waiting.appendleft(sequence)

    def _release(self, sequence: Sequence) -> None:
        self._blocks.free(sequence.blocks)
        sequence.blocks = []
        if sequence.slot is not None:
            del self._by_slot[sequence.slot]
            self._slots.release(sequence.slot)
            sequence.slot = None
        sequence.in_flight = 0

    def _work(
        self, sequence: Sequence, chunk: int, scored: bool = False, drafts: tuple[int, ...] = ()
    ) -> SlotWork:
        start = sequence.num_computed
        end = start + chunk
        # A zero output budget (echo of a scored prompt) prefills without sampling.
        sample = end == sequence.num_tokens and sequence.remaining > 0
        if sequence.slot is None:
            raise ValueError(f"sequence {sequence.request_id} is planned without a slot")
        sequence.in_flight = chunk
        # The thinking budget's forced end replaces the lane's draw (and its verification).
        forced = sequence.forced_token if sample else None
        # With speculation on, every decode lane verifies: proposals, or a width-one round.
        speculative = (
            self._config.speculative is not None
            and sample
            and chunk == 1
            and not scored
            and forced is None
        )
        propose = sequence.pending_proposals if speculative and sequence.draft_model else 0
        banned = sequence.banned_until_min_tokens
        if len(sequence.outputs) >= sequence.params.min_tokens:
            banned = ()
        # The grammar travels only once it has started (after the reasoning, when the output
        # begins inside it): until then the lane is free text.
        grammar_start = sequence.grammar_start
        return SlotWork(
            slot=sequence.slot,
            epoch=sequence.epoch,
            token_ids=sequence.tokens_between(start, end) + drafts,
            start_position=start,
            block_table=tuple(sequence.blocks),
            prompt_len=len(sequence.prompt),
            sample=sample,
            params=sequence.params,
            seed=sequence.seed,
            stop_token_ids=sequence.stop_token_ids,
            banned_token_ids=banned,
            remaining=max(sequence.remaining, 1),
            logprobs=sequence.logprobs if sample else None,
            prompt_targets=_unscored_targets(sequence, start, chunk) if scored else (),
            speculative=speculative,
            drafts=drafts,
            propose=propose,
            draft_feed=sequence.tokens_between(sequence.draft_computed, end) if propose else (),
            draft_start=sequence.draft_computed if propose else 0,
            grammar=sequence.grammar if grammar_start is not None else None,
            grammar_start=grammar_start,
            forced_token=forced,
        )


def _unscored_targets(sequence: Sequence, start: int, chunk: int) -> tuple[int, ...]:
    """The chunk's prompt targets, with -1 for rows already published before a preemption."""
    targets = prompt_targets(sequence.prompt, start, chunk)
    return tuple(
        target if start + row >= sequence.scored_rows else NO_TOKEN
        for row, target in enumerate(targets)
    )
