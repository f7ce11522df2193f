"""The torch model executor: runs planned lanes, samples, and commits ABI6 records into frames."""

from __future__ import annotations

import dataclasses

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


class TorchExecutor:
    """Implements `ports.executor.ModelExecutor` over a torch decoder with a paged KV cache.

    Step order: gather the lanes' chunks into one forward, project the sampled rows through the LM
    head (FP32 logits, sliced to the real vocabulary), sample from a scratch copy, commit one record
    per lane into the submission's frame. Frames alternate 0, 1, 0, ...
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
        sampled = self._forward(frame, plan)
        self._commit(frame, plan, sampled)
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

    @torch.inference_mode()
    def _forward(self, frame: int, plan: StepPlan) -> list[int]:
        chunks = [SequenceChunk(w.token_ids, w.start_position, w.block_table) for w in plan.works]
        batch = ForwardBatch.build(chunks, self._geometry.block_size, self._device)
        hidden = self._model(batch, self._kv_cache)
        if plan.scored and self._scores is not None:
            targets = [target for work in plan.works for target in work.prompt_targets]
            lanes = [len(work.token_ids) for work in plan.works]
            self._scores.score(frame, hidden, targets, lanes, self._model.compute_logits)
        sampling = [index for index, work in enumerate(plan.works) if work.sample]
        if not sampling:
            return []
        rows = batch.last_rows[torch.tensor(sampling, dtype=torch.int64, device=self._device)]
        raw_logits = self._model.compute_logits(hidden[rows])  # [R, V_model] float32
        works = [plan.works[index] for index in sampling]
        requesting = self._outputs.upload(frame, works)
        logits = raw_logits[:, : self._geometry.vocab_size]
        tokens = self._sampler.sample(logits, self._sampling_tensors(works))
        if requesting:
            # The reduction reads the raw logits, never the sampler's processed scratch.
            self._outputs.reduce(frame, raw_logits, works, tokens)
        return tokens.tolist()

    def _sampling_tensors(self, works: list[SlotWork]) -> SamplingTensors:
        device = self._device
        params = [w.params for w in works]

        def floats(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32, device=device)

        def longs(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=device)

        any_penalties = any(p.uses_penalties for p in params)
        counts, prompt_mask = (
            self._penalties.rows([w.slot for w in works]) if any_penalties else (None, None)
        )
        bias = [
            (row, token_id, value)
            for row, p in enumerate(params)
            for token_id, value in p.logit_bias
        ]
        banned = [(row, token_id) for row, w in enumerate(works) for token_id in w.banned_token_ids]
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
            seeds=longs([_signed64(w.seed) for w in works]),
            counters=longs([w.end_position for w in works]),
            all_greedy=all(p.is_greedy for p in params),
            any_penalties=any_penalties,
        )

    def _commit(self, frame: int, plan: StepPlan, sampled: list[int]) -> None:
        tokens = iter(sampled)
        records = []
        for work in plan.works:
            if work.sample:
                emitted, finish = commit_round(work, (next(tokens),))
                records.append(
                    CompletionRecord(
                        slot=work.slot,
                        epoch=work.epoch,
                        role=Role.SAMPLE,
                        tokens=emitted,
                        first_position=work.end_position,
                        finish=finish,
                        generated_total=work.end_position - work.prompt_len + 1,
                    )
                )
            else:
                records.append(
                    CompletionRecord(
                        slot=work.slot,
                        epoch=work.epoch,
                        role=Role.PROMPT,
                        first_position=work.end_position,
                    )
                )
        self._outputs.commit(frame, records)


def _signed64(seed: int) -> int:
    """Seeds are unsigned 64-bit in the domain; torch int64 holds the same bits signed."""
    seed &= (1 << 64) - 1
    return seed - (1 << 64) if seed >= 1 << 63 else seed
