"""The torch model executor: runs planned lanes, samples, and commits ABI6 records into frames."""

from __future__ import annotations

import dataclasses
import itertools
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from adapters.gpu.distributed.collectives import Collectives
from adapters.gpu.distributed.shards import VocabShard
from adapters.gpu.grammar.lanes import GrammarLanes, RowMasks
from adapters.gpu.lane_records import forced_record, prompt_record, retired_record, sampled_record
from adapters.gpu.logprobs.completion_outputs import CompletionOutputs
from adapters.gpu.model.decoder import DecoderModel
from adapters.gpu.model.forward_batch import ForwardBatch, SequenceChunk
from adapters.gpu.model.kv_cache import PagedKVCache
from adapters.gpu.sampling.penalty_state import PenaltyState
from adapters.gpu.sampling.rows import lane_rows, sampling_tensors
from adapters.gpu.sampling.sampler import Sampler
from adapters.gpu.sampling.sampler_vp import ShardRows
from adapters.gpu.scoring.prompt_score_frames import PromptScoreFrames
from adapters.gpu.scoring.prompt_scorer import PromptScorer
from adapters.gpu.scoring.prompt_scorer_vp import VocabParallelPromptScorer
from adapters.gpu.speculation.draft_runner import DraftRunner
from domain.contract.frames import FrameResult, LaneFailure
from domain.contract.geometry import ExecutorGeometry
from domain.contract.records import CompletionRecord, Finish
from domain.engine.commit import commit_round
from domain.engine.step import SlotWork, StepPlan
from domain.logprobs.prompt_scores import PROMPT_ROW_WORDS
from domain.overlap.late_commit import commits_late, drawn_tokens
from domain.overlap.pending import last_tokens, resolve_pending
from domain.speculation.verdict import speculative_verdict
from ports.grammar import MaskingCompiler


@dataclass(frozen=True, slots=True)
class _Round:
    """A submission's sampled rows: the raw target logits, where each sampling lane's rows
    start among them, and what each lane's verification (or plain sampling) chose."""

    raw_logits: torch.Tensor  # float32 [R, V_model]: raw rows, read by the reduction only
    first_rows: tuple[int, ...]  # per sampling lane, in plan order
    drafts: tuple[tuple[int, ...], ...]  # per sampling lane: the drafts it verified
    sampled: tuple[tuple[int, ...], ...]  # per sampling lane: accepted drafts, then one token
    accepted: tuple[int, ...]  # per sampling lane: drafts that stood


@dataclass(frozen=True, slots=True)
class _Launched:
    """A submission's sampled rows as the device left them, before the host reads its choices:
    plain sampling leaves `chosen` [R]; verification leaves `keeps` [R] beside it."""

    raw_logits: torch.Tensor
    first_rows: tuple[int, ...]
    drafts: tuple[tuple[int, ...], ...]
    chosen: torch.Tensor
    keeps: torch.Tensor | None = None


@dataclass(frozen=True, slots=True)
class _Late:
    """A submission launched with its commit left for later (`commits_late`)."""

    frame: int
    plan: StepPlan
    launched: _Launched


class TorchExecutor:
    """Implements `ports.executor.ModelExecutor` over a torch decoder with a paged KV cache.

    Step order: gather the lanes' chunks into one forward; project each sampling lane's target
    rows through the LM head (FP32 logits, sliced to the real vocabulary; a speculative lane has
    one row per fed token, the others their last row); sample, or verify a speculative lane's
    drafts, from scratch copies; commit one record per lane through the shared commit rule;
    only then reduce the raw logits of the emitted positions into the logprob frame. Frames
    alternate 0, 1, 0, ...

    A plan whose records follow from its draws alone (`domain.overlap.late_commit`) commits
    late, on a single rank: `submit` launches it and returns; the next `submit` reads its
    tokens, launches its reduction (the draws are the emitted tokens), fills the new plan's
    placeholders from them and launches the new forward, then commits the step before while
    the device runs; `settle` (and `read`) commits a frame no submission followed.

    A model split over tensor-parallel ranks (`model.split`) makes this one rank's executor:
    every rank submits the same plans, holds its vocabulary shard of the logits, samples and
    verifies through the sharded exchanges, takes rank 0's outcome (the acceptance broadcast)
    and reduces its shard through the vocabulary-parallel logprob reducer and prompt scorer.
    Only rank 0 reads frames back.

    Constrained lanes (`SlotWork.grammar`) get their token masks from `GrammarLanes`, computed
    on a worker thread while the forward runs and applied to the sampler's scratch only; the
    reduction still reads the raw rows. Every tensor-parallel rank keeps its own matchers, in
    step because all commit rank 0's records, and applies its shard's words of each mask.

    A lane whose grammar breaks while its request runs (while its masks are computed, or when
    its matcher refuses what it emitted) is retired, never the step: its record emits nothing
    and finishes with ERROR, `read` reports it in `FrameResult.failures` with its own message,
    and the other lanes commit as if it were not there. Tensor-parallel ranks retire the same
    lanes: a lane any rank retired is retired on every rank (one all-reduce of a flag per lane,
    on steps with a constrained lane), so no matcher is left out of step.

    A lane with a forced token (`SlotWork.forced_token`) draws nothing: its row is not
    projected, no Philox noise is generated for it, and its record carries the token with the
    forced mask set. Noise is keyed by (seed, position, stream) with no generator state, so the
    draws at every later position are exactly those the lane would make had that position been
    sampled; "draw nothing" means no row of the step is keyed by the forced position.
    """

    def __init__(
        self,
        model: DecoderModel,
        kv_cache: PagedKVCache,
        geometry: ExecutorGeometry,
        device: torch.device,
        *,
        logprobs_backend: str = "reference",
        draft: DraftRunner | None = None,
        grammars: MaskingCompiler | None = None,
    ) -> None:
        self._model = model
        self._grammar = GrammarLanes(grammars, device) if grammars is not None else None
        self._draft = draft
        self._kv_cache = kv_cache
        self._geometry = geometry
        self._device = device
        self._collectives: Collectives | None = model.collectives
        split = model.split
        self._lanes = (0, geometry.vocab_size) if split is None else split.vocab
        if split is not None and self._collectives is not None:
            shard = VocabShard.of(
                geometry.vocab_size, split.rank, split.world_size, 1 << 30, "sampling"
            )
            self._sampler = Sampler(ShardRows(shard, self._collectives))
        else:
            self._sampler = Sampler()
        self._penalties = PenaltyState(
            geometry.capacity, geometry.vocab_size, device, lanes=self._lanes
        )
        # Two frames so a reader can hold one while the next submission writes the other.
        self._outputs = CompletionOutputs(
            geometry, device, logprobs_backend, split=split, collectives=self._collectives
        )
        # Scoring storage exists only when the geometry declares scored capacities.
        self._scores = None
        if geometry.logprobs.scores_prompts:
            scorer: PromptScorer | VocabParallelPromptScorer = PromptScorer(geometry.vocab_size)
            if split is not None:
                scorer = VocabParallelPromptScorer(
                    geometry.vocab_size, split.rank, split.world_size, self._collectives
                )
            self._scores = PromptScoreFrames(
                geometry.logprobs.scored_capacities, geometry.vocab_size, device, scorer
            )
        self._next_frame = 0
        # Per frame: the lanes its submission retired.
        self._failures: list[tuple[LaneFailure, ...]] = [(), ()]
        # What a plan made ahead feeds: the previous submission's last tokens by (slot, epoch).
        self._feeds: dict[tuple[int, int], int] = {}
        # A submission launched and not yet committed (`commits_late`), then landed: its
        # tokens read and its reduction launched, its commit still to come.
        self._late: _Late | None = None
        self._landed: tuple[_Late, _Round] | None = None
        # Per frame: why a late submission failed, raised by its `read`.
        self._errors: dict[int, Exception] = {}

    @property
    def geometry(self) -> ExecutorGeometry:
        return self._geometry

    def submit(self, plan: StepPlan) -> int:
        frame = self._next_frame
        self._next_frame ^= 1
        # The previous submission's tokens: this one's placeholders feed them. Its reduction
        # is launched now, ahead of this forward, and before this upload rewrites the request
        # flags it reads.
        self.land()
        landed, self._landed = self._landed, None
        feeds, self._feeds = self._feeds, {}
        if landed is not None:
            feeds = self._drawn(landed)
        try:
            plan = resolve_pending(plan, feeds)
            if plan.scored and self._scores is None:
                raise ValueError("a scored plan needs an executor prepared with scored capacities")
            for work in plan.works:
                if work.slot >= self._geometry.capacity:
                    raise ValueError(
                        f"slot {work.slot} is outside the capacity {self._geometry.capacity}"
                    )
                self._penalties.observe(work)
            with torch.inference_mode():
                launched, failed = self._forward(frame, plan)
        finally:
            # The host's commit of the previous submission, while the device runs this one.
            if landed is not None:
                self._commit_landed(landed)
        with torch.inference_mode():
            if launched is not None and self._commits_late(plan):
                self._late = _Late(frame, plan, launched)
                return frame
            sampled = _sampled(launched) if launched is not None else None
            records = self._commit(frame, plan, sampled, failed)
            self._feeds = last_tokens(records)
            if sampled is not None:
                emitted = [
                    record.tokens
                    for work, record in zip(plan.works, records, strict=True)
                    if work.sample and work.forced_token is None
                ]
                self._reduce(frame, plan, sampled, emitted)
        return frame

    def land(self) -> int | None:
        """Waits for a late step's tokens and launches its reduction; its frame, or None."""
        late, self._late = self._late, None
        if late is not None:
            self._landed = self._land(late)
        return self._landed[0].frame if self._landed is not None else None

    def settle(self, frame: int) -> None:
        """Commits `frame` if its submission left the commit for later."""
        # Each field read once: under `BackgroundExecutor` the engine thread's `read` calls
        # this for a frame the worker has settled, while the worker may be landing the next.
        late = self._late
        if late is not None and late.frame == frame:
            self.land()
        landed = self._landed
        if landed is None or landed[0].frame != frame:
            return
        self._landed = None
        self._feeds = self._drawn(landed)
        self._commit_landed(landed)

    def read(self, frame: int) -> FrameResult:
        self.settle(frame)
        error = self._errors.pop(frame, None)
        if error is not None:
            raise error
        result = self._outputs.read(frame)
        if self._failures[frame]:
            result = dataclasses.replace(result, failures=self._failures[frame])
        if self._scores is None:
            return result
        scores = self._scores.read(frame)
        # The scores read copies exactly the frame's fed rows, 43 int32 words each.
        rows = sum(len(lane) for lane in scores)
        return dataclasses.replace(
            result,
            prompt_scores=scores,
            payload_bytes=result.payload_bytes + rows * PROMPT_ROW_WORDS * 4,
        )

    def _commits_late(self, plan: StepPlan) -> bool:
        """A single rank only: tensor-parallel ranks keep one order of exchanges, and a late
        commit's place in it would depend on when rank 0's engine reads."""
        return self._collectives is None and commits_late(plan)

    def _land(self, late: _Late) -> tuple[_Late, _Round] | None:
        """Reads a late submission's choices off the device and launches its reduction; None
        (the failure kept for its `read`) if that raised."""
        try:
            with torch.inference_mode():
                sampled = _sampled(late.launched)
                self._reduce(late.frame, late.plan, sampled, list(sampled.sampled))
        except Exception as error:  # noqa: BLE001 - the late step's requests fail at its read
            self._errors[late.frame] = error
            return None
        return late, sampled

    def _drawn(self, landed: tuple[_Late, _Round] | None) -> dict[tuple[int, int], int]:
        if landed is None:
            return {}
        late, sampled = landed
        return drawn_tokens(late.plan, (tokens[-1] for tokens in sampled.sampled))

    def _commit_landed(self, landed: tuple[_Late, _Round] | None) -> None:
        """A late submission's records into its frame; a failure is kept for its `read`."""
        if landed is None:
            return
        late, sampled = landed
        try:
            self._commit(late.frame, late.plan, sampled, {})
        except Exception as error:  # noqa: BLE001 - the late step's requests fail at its read
            self._errors[late.frame] = error

    def _forward(self, frame: int, plan: StepPlan) -> tuple[_Launched | None, dict[int, str]]:
        """The step's sampled rows as launched (None when no lane draws) and, by slot, the
        lanes whose grammar broke while their masks were computed."""
        # Lanes with a forced token emit it without a draw: their rows are never projected,
        # sampled or reduced, yet their logprob requests are uploaded like any emitting lane's.
        sampling = _drawing(plan)
        drafts, q = self._drafts(sampling)
        first_rows = list(
            itertools.accumulate(
                (
                    1 + len(d) if w.speculation is not None else 1
                    for w, d in zip(sampling, drafts, strict=True)
                ),
                initial=0,
            )
        )[:-1]
        masks = self._start_masks(plan, sampling, drafts, first_rows)
        # Proposed drafts are fed after the lane's tokens, as history drafts already are.
        proposed = iter(drafts)
        chunks = []
        for work in plan.works:
            extra = next(proposed) if work.sample and work.forced_token is None else ()
            fed = work.token_ids + extra if _proposes(work) else work.token_ids
            chunks.append(SequenceChunk(fed, work.start_position, work.block_table))
        batch = ForwardBatch.build(chunks, self._geometry.block_size, self._device)
        hidden = self._model(batch, self._kv_cache)
        if plan.scored and self._scores is not None:
            targets = [target for work in plan.works for target in work.prompt_targets]
            lanes = [len(work.token_ids) for work in plan.works]
            self._scores.score(frame, hidden, targets, lanes, self._model.compute_logits)
        row_masks = masks.result() if masks is not None else None
        failed = dict(row_masks.failed) if row_masks is not None else {}
        emitting = [work for work in plan.works if work.sample]
        if emitting:
            self._outputs.upload(frame, emitting)
        if not sampling:
            return None, failed
        ends = list(itertools.accumulate(batch.chunk_lengths))
        lane_drafts = iter(drafts)
        rows: list[int] = []
        for index, work in enumerate(plan.works):
            if work.sample and work.forced_token is None:
                count = 1 + len(next(lane_drafts)) if work.speculation is not None else 1
                rows.extend(range(ends[index] - count, ends[index]))
        selected = torch.tensor(rows, dtype=torch.int64, device=self._device)
        raw_logits = self._model.compute_logits(hidden[selected])  # [R, V_model] float32
        start, stop = self._lanes
        logits = raw_logits[:, : stop - start]
        sampled_rows = [
            row for w, d in zip(sampling, drafts, strict=True) for row in lane_rows(w, d)
        ]
        tensors = sampling_tensors(
            sampled_rows, self._geometry.vocab_size, self._device, self._penalties, self._lanes
        )
        if row_masks is not None:
            tensors = dataclasses.replace(
                tensors, mask_rows=row_masks.rows, token_bitmask=self._shard_words(row_masks)
            )
        if not any(work.speculation is not None for work in sampling):
            (chosen,) = self._agree(self._sampler.sample(logits, tensors))
            return _Launched(raw_logits, tuple(first_rows), tuple(drafts), chosen), failed
        # A row's draft is the token fed after it; a lane's last row has none (-1).
        row_drafts = [draft for lane in drafts for draft in (*lane, -1)]
        keeps, chosen = self._agree(
            *self._sampler.verify(
                logits,
                tensors,
                torch.tensor(row_drafts, dtype=torch.int64, device=self._device),
                None if q is None else _row_probs(q[:, start:stop], drafts, len(rows)),
            )
        )
        return _Launched(raw_logits, tuple(first_rows), tuple(drafts), chosen, keeps), failed

    def _agree(self, *outcome: torch.Tensor) -> list[torch.Tensor]:
        """The acceptance broadcast: every rank commits rank 0's verdicts and tokens ([R] each).

        The exchanges already give every rank the same winners; taking rank 0's outcome makes
        agreement a property of the protocol rather than of identical arithmetic.
        """
        if self._collectives is None:
            return list(outcome)
        words = torch.cat([part.to(torch.int64) for part in outcome]).contiguous()
        self._collectives.broadcast(words, "acceptance")
        parts = words.split([part.shape[0] for part in outcome])
        return [part.to(like.dtype) for part, like in zip(parts, outcome, strict=True)]

    def _start_masks(
        self,
        plan: StepPlan,
        sampling: list[SlotWork],
        drafts: list[tuple[int, ...]],
        first_rows: list[int],
    ) -> Future[RowMasks] | None:
        if self._grammar is None:
            if any(work.grammar is not None for work in plan.works):
                raise ValueError("a lane is constrained, but the executor has no grammar engine")
            return None
        return self._grammar.start(plan.works, sampling, drafts, first_rows)

    def _shard_words(self, row_masks: RowMasks) -> torch.Tensor:
        """The mask words of this rank's vocabulary lanes: shards start on whole 1024-lane
        tiles, so a shard's first token is bit 0 of a word."""
        start, stop = self._lanes
        return row_masks.bitmask[:, start // 32 : (stop + 31) // 32]

    def _drafts(
        self, sampling: list[SlotWork]
    ) -> tuple[list[tuple[int, ...]], torch.Tensor | None]:
        """Each sampling lane's drafts: its history drafts, or its draft model's proposals
        (then also their distributions q, lane after lane)."""
        proposing = [work for work in sampling if _proposes(work)]
        if not proposing:
            return [work.drafts for work in sampling], None
        if self._draft is None:
            raise ValueError("a lane asks for draft-model proposals, but no draft model is loaded")
        proposals = self._draft.propose(proposing)
        made = iter(proposals.drafts)
        return [next(made) if _proposes(work) else work.drafts for work in sampling], proposals.q

    def _commit(
        self, frame: int, plan: StepPlan, sampled: _Round | None, failed: dict[int, str]
    ) -> list[CompletionRecord]:
        """One record per lane, through the shared commit rule; accepted drafts join the
        penalty counts. Lanes retired on any rank (`failed`: the grammar broke while masking;
        or the matcher refuses what the lane emitted) get an ERROR record that emits nothing."""
        rounds = (
            iter(zip(sampled.drafts, sampled.sampled, sampled.accepted, strict=True))
            if sampled
            else None
        )
        outcomes: list[tuple[tuple[int, ...], int, tuple[int, ...], Finish] | None] = []
        for work in plan.works:
            if work.forced_token is not None or not work.sample or rounds is None:
                outcomes.append(None)
                continue
            drafts, tokens, accepted = next(rounds)
            emitted, finish, accepted = commit_round(work, tokens, accepted)
            outcomes.append((drafts, accepted, emitted, finish))
            if self._grammar is not None and work.slot not in failed:
                broke = self._grammar.commit(work, emitted)
                if broke is not None:
                    failed[work.slot] = broke
        retired = self._retired(plan, failed)
        records, failures = [], []
        for work, outcome in zip(plan.works, outcomes, strict=True):
            if work.slot in retired:
                records.append(retired_record(work))
                param = work.grammar.spec.param if work.grammar is not None else None
                failures.append(LaneFailure(work.slot, work.epoch, retired[work.slot], param))
                continue
            if work.forced_token is not None:
                records.append(forced_record(work))
                continue
            if outcome is None:
                records.append(prompt_record(work))
                continue
            drafts, accepted, emitted, finish = outcome
            self._penalties.accept(work, drafts[:accepted])
            records.append(
                sampled_record(
                    work, emitted, finish, drafts_offered=len(drafts), drafts_accepted=accepted
                )
            )
        self._outputs.commit(frame, records)
        self._failures[frame] = tuple(failures)
        return records

    def _retired(self, plan: StepPlan, failed: dict[int, str]) -> dict[int, str]:
        """The lanes every rank retires, by slot, with this rank's message for each.

        Tensor-parallel ranks all-reduce one flag per lane (the highest failing rank + 1), so a
        lane that broke on any rank is retired on all of them and no matcher is left out of
        step; rank 0 names a peer's failure without its text, which stays on that peer.
        """
        collectives = self._collectives
        if collectives is None or not any(work.grammar is not None for work in plan.works):
            return failed
        rank = collectives.rank
        flags = torch.tensor(
            [rank + 1 if work.slot in failed else 0 for work in plan.works],
            dtype=torch.int64,
            device=self._device,
        )
        collectives.all_reduce(flags, "retired lanes", op="max")
        retired = {}
        for work, flag in zip(plan.works, flags.tolist(), strict=True):
            if not flag:
                continue
            if work.slot not in failed and self._grammar is not None:
                self._grammar.retire(work.slot)
            retired[work.slot] = failed.get(work.slot) or (
                f"the output constraint broke on tensor-parallel rank {flag - 1} while generating"
            )
        return retired

    def _reduce(
        self,
        frame: int,
        plan: StepPlan,
        sampled: _Round,
        emitted: list[tuple[int, ...]],
    ) -> None:
        """The logprob writer: after the commit (or, for a plan that commits late, after the
        draw, which decides the same tokens), over the raw target rows of emitted positions
        only (accepted drafts, the correction, the bonus); rejected and unoffered rows are
        never read. `emitted` holds what each drawing lane emitted, in plan order."""
        if not any(work.sampling.logprobs is not None for work in plan.works if work.sample):
            return
        rows, slots, positions, chosen = [], [], [], []
        lanes = (work for work in plan.works if work.sample and work.forced_token is None)
        for first_row, work, tokens in zip(sampled.first_rows, lanes, emitted, strict=True):
            for position, token_id in enumerate(tokens):
                rows.append(first_row + position)
                slots.append(work.slot)
                positions.append(position)
                chosen.append(token_id)
        self._outputs.reduce(frame, sampled.raw_logits, rows, slots, positions, chosen)


def _sampled(launched: _Launched) -> _Round:
    """The host's read of a launched submission's choices (it waits for the device), each
    lane's round under the shared speculative verdict where it verified drafts."""
    chosen = launched.chosen.tolist()
    if launched.keeps is None:
        return _Round(
            launched.raw_logits,
            launched.first_rows,
            launched.drafts,
            tuple((t,) for t in chosen),
            (0,) * len(launched.first_rows),
        )
    return _verdicts(
        list(launched.drafts),
        list(launched.first_rows),
        launched.raw_logits,
        launched.keeps.tolist(),
        chosen,
    )


def _proposes(work: SlotWork) -> bool:
    """The lane's drafts come from the executor's draft model."""
    return work.speculation is not None and work.speculation.propose > 0


def _drawing(plan: StepPlan) -> list[SlotWork]:
    """The lanes that draw a token this step: sampling lanes without a forced one."""
    return [work for work in plan.works if work.sample and work.forced_token is None]


def _row_probs(q: torch.Tensor, drafts: list[tuple[int, ...]], rows: int) -> torch.Tensor:
    """The draft distributions [R, V] aligned with the target rows: row j of a lane holds the
    q its draft j was drawn from; rows without a draft hold zeros, which no rule reads."""
    placed = torch.zeros((rows, q.shape[1]), dtype=q.dtype, device=q.device)
    targets: list[int] = []
    row = 0
    for lane in drafts:
        targets.extend(range(row, row + len(lane)))
        row += len(lane) + 1
    placed[torch.tensor(targets, dtype=torch.int64, device=q.device)] = q
    return placed


def _verdicts(
    drafts: list[tuple[int, ...]],
    first_rows: list[int],
    raw_logits: torch.Tensor,
    keeps: list[bool],
    chosen: list[int],
) -> _Round:
    """Each lane's round under the shared speculative verdict (`domain.verdict`), its rows
    read from the step's keeps and chosen tokens from its first row on."""
    verdicts = []
    for lane, first in zip(drafts, first_rows, strict=True):
        rows = slice(first, first + len(lane) + 1)
        verdicts.append(speculative_verdict(lane, zip(keeps[rows], chosen[rows], strict=True)))
    return _Round(
        raw_logits,
        tuple(first_rows),
        tuple(drafts),
        tuple(verdict.tokens for verdict in verdicts),
        tuple(verdict.accepted for verdict in verdicts),
    )
