"""The draft model of `--speculative-config` draft_model: proposes lanes' drafts on its own KV."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from adapters.gpu.distributed.collectives import Collectives
from adapters.gpu.model.decoder import DecoderModel
from adapters.gpu.model.forward_batch import ForwardBatch, SequenceChunk
from adapters.gpu.model.kv_cache import PagedKVCache
from adapters.gpu.sampling.rows import SampledRow, sampling_tensors
from adapters.gpu.sampling.sampler import Sampler
from domain.engine.step import SlotWork


@dataclass(frozen=True, slots=True)
class Proposals:
    """Each proposing lane's drafts, in plan order, and the distribution each draft was drawn
    from (q, float32 [sum of drafts, V]), lane after lane."""

    drafts: tuple[tuple[int, ...], ...]
    q: torch.Tensor


class DraftRunner:
    """Runs a smaller model with the target's vocabulary over the lanes that propose.

    Its paged cache has the target's block size and block count, and each lane uses the
    target's block table: the target reserved room for the drafts, so the two caches stay in
    step, and a preemption, which frees the blocks, empties both. A lane first catches up on
    `draft_feed` (whatever the draft cache lacks, the lane's last token included), which
    proposes the first draft; each further draft is one more decode step.

    Under tensor parallelism every rank runs a whole copy of the draft model, and `collectives`
    makes every rank take rank 0's drafts and rank 0's q at them, so the target forward feeds
    the same tokens everywhere and acceptance tests the same ratio.
    """

    def __init__(
        self,
        model: DecoderModel,
        kv_cache: PagedKVCache,
        vocab_size: int,
        device: torch.device,
        collectives: Collectives | None = None,
    ) -> None:
        self._model = model
        self._kv_cache = kv_cache
        self._vocab_size = vocab_size
        self._device = device
        self._sampler = Sampler()
        self._collectives = collectives

    def propose(self, works: list[SlotWork]) -> Proposals:
        """Drafts for the given lanes, in their order; each must propose (`DraftLane.propose`)."""
        lanes = [w.speculation for w in works]
        if any(lane is None or not lane.propose for lane in lanes):
            raise ValueError("only lanes that propose drafts go to the draft model")
        proposing = [lane for lane in lanes if lane is not None]
        chunks = [
            SequenceChunk(lane.draft_feed, lane.draft_start, w.block_table)
            for w, lane in zip(works, proposing, strict=True)
        ]
        drafts: list[list[int]] = [[] for _ in works]
        q_rows: list[list[torch.Tensor]] = [[] for _ in works]
        live = list(range(len(works)))
        while live:
            batch = ForwardBatch.build(chunks, self._kv_cache.block_size, self._device)
            hidden = self._model(batch, self._kv_cache)
            logits = self._model.compute_logits(hidden[batch.last_rows])[:, : self._vocab_size]
            rows = [
                SampledRow(works[i], tuple(drafts[i]), works[i].end_position + len(drafts[i]))
                for i in live
            ]
            tokens, q = self._agree(
                *self._sampler.draw(
                    logits, sampling_tensors(rows, self._vocab_size, self._device, None)
                )
            )
            for row, (index, token_id) in enumerate(zip(live, tokens.tolist(), strict=True)):
                drafts[index].append(token_id)
                q_rows[index].append(q[row])
            live = [i for i in live if len(drafts[i]) < proposing[i].propose]
            chunks = [
                SequenceChunk(
                    (drafts[i][-1],),
                    works[i].end_position + len(drafts[i]) - 1,
                    works[i].block_table,
                )
                for i in live
            ]
        return Proposals(
            tuple(tuple(d) for d in drafts),
            torch.stack([row for rows in q_rows for row in rows]),
        )

    def _agree(self, tokens: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rank 0's drafts, with rank 0's probability of each written into this rank's q."""
        if self._collectives is None:
            return tokens, q
        at = q.gather(1, tokens.unsqueeze(1)).squeeze(1).to(torch.float64)
        words = torch.stack([tokens.to(torch.float64), at], dim=1).contiguous()
        self._collectives.broadcast(words, "drafts")
        agreed = words[:, 0].to(torch.int64)
        return agreed, q.scatter(1, agreed.unsqueeze(1), words[:, 1:].to(q.dtype))
