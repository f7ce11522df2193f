"""The torch model executor: runs planned lanes, samples, and commits ABI6 records into frames."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import torch

from adapters.gpu.logprobs.completion_outputs import CompletionOutputs
from adapters.gpu.model.decoder import DecoderModel
from adapters.gpu.model.forward_batch import ForwardBatch, SequenceChunk
from adapters.gpu.model.kv_cache import PagedKVCache
from adapters.gpu.sampling.penalty_state import PenaltyState
from adapters.gpu.sampling.sampler import Sampler, SamplingTensors
from adapters.gpu.scoring.prompt_score_frames import PromptScoreFrames
from domain.commit import commit_round
from domain.prompt_scores import PROMPT_ROW_WORDS
from domain.records import CompletionRecord, Role
from domain.step import ExecutorGeometry, FrameResult, SlotWork, StepPlan


@dataclass(frozen=True, slots=True)
class _Round:
    """A submission's sampled rows: the raw target logits, where each sampling lane's rows
    start among them, and what each lane's verification (or plain sampling) chose."""

    raw_logits: torch.Tensor  # float32 [R, V_model]: raw rows, read by the reduction only
    first_rows: tuple[int, ...]  # per sampling lane, in plan order
    sampled: tuple[tuple[int, ...], ...]  # per sampling lane: accepted drafts, then one token
    accepted: tuple[int, ...]  # per sampling lane: drafts that stood


class TorchExecutor:
    """Implements `ports.executor.ModelExecutor` over a torch decoder with a paged KV cache.

    Step order: gather the lanes' chunks into one forward; project each sampling lane's target
    rows through the LM head (FP32 logits, sliced to the real vocabulary; a speculative lane has
    one row per fed token, the others their last row); sample, or verify a speculative lane's
    drafts, from scratch copies; commit one record per lane through the shared commit rule;
    only then reduce the raw logits of the emitted positions into the logprob frame. Frames
    alternate 0, 1, 0, ...
    """

    def __init__(
        self,
        model: DecoderModel,
        kv_cache: PagedKVCache,
        geometry: ExecutorGeometry,
        device: torch.device,
        *,
        logprobs_backend: str = "reference",
    ) -> None:
        self._model = model
        self._kv_cache = kv_cache
        self._geometry = geometry
        self._device = device
        self._sampler = Sampler()
        self._penalties = PenaltyState(geometry.capacity, geometry.vocab_size, device)
        # Two frames so a reader can hold one while the next submission writes the other.
        self._outputs = CompletionOutputs(geometry, device, logprobs_backend)
        # Scoring storage exists only when the geometry declares scored capacities.
        self._scores = (
            PromptScoreFrames(geometry.scored_capacities, geometry.vocab_size, device)
            if geometry.scores_prompts
            else None
        )
        self._next_frame = 0

    @property
    def geometry(self) -> ExecutorGeometry:
        return self._geometry

    def submit(self, plan: StepPlan) -> int:
        frame = self._next_frame
        self._next_frame ^= 1
        if plan.scored and self._scores is None:
            raise ValueError("a scored plan needs an executor prepared with scored capacities")
        for work in plan.works:
            if work.slot >= self._geometry.capacity:
                raise ValueError(
                    f"slot {work.slot} is outside the capacity {self._geometry.capacity}"
                )
            self._penalties.observe(work)
        with torch.inference_mode():
            sampled = self._forward(frame, plan)
            records = self._commit(frame, plan, sampled)
            if sampled is not None:
                self._reduce(frame, plan, sampled, records)
        return frame

    def read(self, frame: int) -> FrameResult:
        result = self._outputs.read(frame)
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

    def _forward(self, frame: int, plan: StepPlan) -> _Round | None:
        chunks = [SequenceChunk(w.token_ids, w.start_position, w.block_table) for w in plan.works]
        batch = ForwardBatch.build(chunks, self._geometry.block_size, self._device)
        hidden = self._model(batch, self._kv_cache)
        if plan.scored and self._scores is not None:
            targets = [target for work in plan.works for target in work.prompt_targets]
            lanes = [len(work.token_ids) for work in plan.works]
            self._scores.score(frame, hidden, targets, lanes, self._model.compute_logits)
        works = [work for work in plan.works if work.sample]
        if not works:
            return None
        ends = list(itertools.accumulate(batch.chunk_lengths))
        rows: list[int] = []
        first_rows: list[int] = []
        for index, work in enumerate(plan.works):
            if work.sample:
                first_rows.append(len(rows))
                count = _target_rows(work)
                rows.extend(range(ends[index] - count, ends[index]))
        selected = torch.tensor(rows, dtype=torch.int64, device=self._device)
        raw_logits = self._model.compute_logits(hidden[selected])  # [R, V_model] float32
        self._outputs.upload(frame, works)
        logits = raw_logits[:, : self._geometry.vocab_size]
        tensors = self._sampling_tensors(works)
        if not any(work.speculative for work in works):
            plain = self._sampler.sample(logits, tensors).tolist()
            return _Round(
                raw_logits, tuple(first_rows), tuple((t,) for t in plain), (0,) * len(works)
            )
        # A row's draft is the token fed after it; a lane's last row has none (-1).
        drafts = [draft for work in works for draft in (*work.drafts, -1)]
        keeps, chosen = self._sampler.verify(
            logits, tensors, torch.tensor(drafts, dtype=torch.int64, device=self._device)
        )
        return _verdicts(works, first_rows, raw_logits, keeps.tolist(), chosen.tolist())

    def _sampling_tensors(self, works: list[SlotWork]) -> SamplingTensors:
        """Per target row: a speculative lane's rows share its settings, draw at their own
        positions, and count the drafts before them as generated (penalties)."""
        device = self._device
        lanes = [(work, row) for work in works for row in range(_target_rows(work))]
        params = [work.params for work, _ in lanes]

        def floats(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32, device=device)

        def longs(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=device)

        any_penalties = any(p.uses_penalties for p in params)
        counts, prompt_mask = (
            self._penalties.rows([w.slot for w, _ in lanes]) if any_penalties else (None, None)
        )
        if counts is not None:
            earlier = [(i, t) for i, (w, row) in enumerate(lanes) for t in w.drafts[:row]]
            if earlier:
                counts.index_put_(
                    (longs([i for i, _ in earlier]), longs([t for _, t in earlier])),
                    torch.ones(len(earlier), dtype=torch.int32, device=device),
                    accumulate=True,
                )
        bias = [
            (row, token_id, value)
            for row, p in enumerate(params)
            for token_id, value in p.logit_bias
        ]
        banned = [
            (row, token_id) for row, (w, _) in enumerate(lanes) for token_id in w.banned_token_ids
        ]
        return SamplingTensors(
            temperature=floats([p.temperature for p in params]),
            top_k=torch.tensor(
                [min(max(p.top_k, 0), self._geometry.vocab_size) for p in params],
                dtype=torch.int32,
                device=device,
            ),
            top_p=floats([p.top_p for p in params]),
            min_p=floats([p.min_p for p in params]),
            presence_penalty=floats([p.presence_penalty for p in params]),
            frequency_penalty=floats([p.frequency_penalty for p in params]),
            repetition_penalty=floats([p.repetition_penalty for p in params]),
            output_counts=counts,
            prompt_mask=prompt_mask,
            bias_rows=longs([b[0] for b in bias]),
            bias_token_ids=longs([b[1] for b in bias]),
            bias_values=floats([b[2] for b in bias]),
            banned_rows=longs([b[0] for b in banned]),
            banned_token_ids=longs([b[1] for b in banned]),
            seeds=longs([_signed64(w.seed) for w, _ in lanes]),
            # The position of the token each row chooses keys its noise.
            counters=longs([w.first_emitted_position + row for w, row in lanes]),
            all_greedy=all(p.is_greedy for p in params),
            any_penalties=any_penalties,
        )

    def _commit(self, frame: int, plan: StepPlan, sampled: _Round | None) -> list[CompletionRecord]:
        """One record per lane, through the shared commit rule; accepted drafts join the
        penalty counts."""
        rounds = iter(zip(sampled.sampled, sampled.accepted, strict=True)) if sampled else None
        records = []
        for work in plan.works:
            if not work.sample or rounds is None:
                records.append(
                    CompletionRecord(
                        slot=work.slot,
                        epoch=work.epoch,
                        role=Role.PROMPT,
                        first_position=work.end_position,
                    )
                )
                continue
            tokens, accepted = next(rounds)
            emitted, finish = commit_round(work, tokens)
            self._penalties.accept(work, work.drafts[:accepted])
            records.append(
                CompletionRecord(
                    slot=work.slot,
                    epoch=work.epoch,
                    role=Role.SPECULATIVE if work.speculative else Role.SAMPLE,
                    tokens=emitted,
                    first_position=work.first_emitted_position,
                    finish=finish,
                    drafts_offered=len(work.drafts),
                    drafts_accepted=accepted,
                    generated_total=work.first_emitted_position - work.prompt_len + len(emitted),
                )
            )
        self._outputs.commit(frame, records)
        return records

    def _reduce(
        self, frame: int, plan: StepPlan, sampled: _Round, records: list[CompletionRecord]
    ) -> None:
        """The logprob writer: after the commit, over the raw target rows of emitted positions
        only (accepted drafts, the correction, the bonus); rejected and unoffered rows are
        never read."""
        if not any(work.logprobs is not None for work in plan.works if work.sample):
            return
        rows, slots, positions, chosen = [], [], [], []
        lanes = (record for work, record in zip(plan.works, records, strict=True) if work.sample)
        for first_row, record in zip(sampled.first_rows, lanes, strict=True):
            for position, token_id in enumerate(record.tokens):
                rows.append(first_row + position)
                slots.append(record.slot)
                positions.append(position)
                chosen.append(token_id)
        self._outputs.reduce(frame, sampled.raw_logits, rows, slots, positions, chosen)


def _target_rows(work: SlotWork) -> int:
    """Rows a sampling lane projects: one per fed token when it verifies, else its last one."""
    return 1 + len(work.drafts) if work.speculative else 1


def _verdicts(
    works: list[SlotWork],
    first_rows: list[int],
    raw_logits: torch.Tensor,
    keeps: list[bool],
    chosen: list[int],
) -> _Round:
    """Each lane's drafts stand while their rows keep them; the first row that does not emits
    its own token (the correction), and a fully kept run emits the last row's (the bonus)."""
    sampled, accepted = [], []
    for work, first_row in zip(works, first_rows, strict=True):
        tokens: list[int] = []
        for offset, draft in enumerate(work.drafts):
            if not keeps[first_row + offset]:
                tokens.append(chosen[first_row + offset])
                break
            tokens.append(draft)
        else:
            tokens.append(chosen[first_row + len(work.drafts)])
        sampled.append(tuple(tokens))
        accepted.append(len(tokens) - 1)
    return _Round(raw_logits, tuple(first_rows), tuple(sampled), tuple(accepted))


def _signed64(seed: int) -> int:
    """Seeds are unsigned 64-bit in the domain; torch int64 holds the same bits signed."""
    seed &= (1 << 64) - 1
    return seed - (1 << 64) if seed >= 1 << 63 else seed
