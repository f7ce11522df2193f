"""Sampling over a vocabulary shard: whole-row maxima, cutoffs, normalizers, winners by exchange."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from adapters.gpu.distributed.collectives import Collectives
from adapters.gpu.distributed.shards import VocabShard
from adapters.gpu.sampling.sampler import SamplingTensors, top_k_top_p_cutoff

# The top-k/top-p exchange: each rank's best CUTOFF_CANDIDATES values of a row, sorted, then the
# shard's (maximum, exponential mass). The merged candidates decide a row's cutoff whenever they
# provably hold every value at or above it; other rows gather their whole scaled rows.
CUTOFF_CANDIDATES = 256
_NO_ID = torch.iinfo(torch.int32).max


class ShardRows:
    """`RowLanes` of one rank's vocabulary shard [start, stop) of `shard`.

    Exchanges (each one all-gather or all-reduce over the rows, purpose "sampling"):
    - argmax: per score matrix, each rank's (best value, its global ID); the winner is the
      largest value, the lowest ID among equals, as a whole-row argmax picks;
    - row_max (min_p): an all-reduce max of one value per row;
    - softmax: each rank's (maximum, exponential mass) for the global normalizer;
    - pick: the owner's value of each row's ID, summed with every other rank's zero (exact);
    - cutoff (top_k, top_p): CUTOFF_CANDIDATES sorted values plus the shard's (maximum, mass)
      per row. A row's cutoff is exact when it lies above every truncated rank's last sent
      value; a row whose cutoff cannot be proven so (top_k above the candidates, or a top_p
      mass spread past them) gathers its scaled rows ("sampling rows gathered", counted).
    """

    def __init__(self, shard: VocabShard, collectives: Collectives) -> None:
        self.shard = shard
        self.first = shard.start
        self._collectives = collectives
        self.gathered_rows = 0

    def argmax(self, *scores: Tensor) -> tuple[Tensor, ...]:
        rows = scores[0].shape[0]
        words = torch.empty((rows, 2 * len(scores)), dtype=torch.int32, device=scores[0].device)
        for index, score in enumerate(scores):
            value, token_id = self._local_best(score)
            words[:, 2 * index] = value.view(torch.int32)
            words[:, 2 * index + 1] = token_id
        gathered = self._collectives.all_gather(words, "sampling")  # [world, R, 2n]
        chosen = []
        for index in range(len(scores)):
            values = gathered[:, :, 2 * index].view(torch.float32)
            ids = gathered[:, :, 2 * index + 1]
            best = values.amax(dim=0)
            contenders = torch.where(values == best, ids, _NO_ID)
            chosen.append(contenders.amin(dim=0).to(torch.int64))
        return tuple(chosen)

    def _local_best(self, score: Tensor) -> tuple[Tensor, Tensor]:
        rows = score.shape[0]
        if score.shape[1] == 0:
            value = torch.full((rows,), -math.inf, dtype=torch.float32, device=score.device)
            return value, torch.full((rows,), _NO_ID, dtype=torch.int32, device=score.device)
        local = score.argmax(dim=1)
        value = score.gather(1, local.unsqueeze(1)).squeeze(1).to(torch.float32)
        return value, (local + self.first).to(torch.int32)

    def row_max(self, scores: Tensor) -> Tensor:
        peak = self._peak(scores)
        self._collectives.all_reduce(peak, "sampling", op="max")
        return peak.unsqueeze(1)

    def _peak(self, scores: Tensor) -> Tensor:
        if scores.shape[1] == 0:
            return torch.full(
                (scores.shape[0],), -math.inf, dtype=torch.float32, device=scores.device
            )
        return scores.amax(dim=1).to(torch.float32)

    def _statistics(self, scores: Tensor) -> tuple[Tensor, Tensor]:
        """This shard's (maximum, sum of exp(value - maximum)) per row; (-inf, 0) when empty."""
        peak = self._peak(scores)
        shift = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))
        mass = (scores - shift.unsqueeze(1)).exp().sum(dim=1) if scores.shape[1] else peak * 0
        return peak, torch.where(torch.isfinite(peak), mass, torch.zeros_like(mass))

    @staticmethod
    def _log_normalizer(peaks: Tensor, masses: Tensor) -> Tensor:
        """log sum over ranks of mass * exp(peak) from [world, R] statistics."""
        top = peaks.amax(dim=0)
        shift = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        scaled = torch.where(
            torch.isfinite(peaks), masses * (peaks - shift).exp(), torch.zeros_like(masses)
        )
        return shift + scaled.sum(dim=0).log()

    def softmax(self, scores: Tensor) -> Tensor:
        peak, mass = self._statistics(scores)
        gathered = self._collectives.all_gather(torch.stack([peak, mass], dim=1), "sampling")
        lse = self._log_normalizer(gathered[:, :, 0], gathered[:, :, 1])
        return (scores - lse.unsqueeze(1)).exp()

    def pick(self, values: Tensor, token_ids: Tensor) -> Tensor:
        owned = (token_ids >= self.shard.start) & (token_ids < self.shard.stop)
        picked = torch.zeros(token_ids.shape, dtype=torch.float32, device=values.device)
        if values.shape[1]:
            local = torch.where(owned, token_ids - self.first, torch.zeros_like(token_ids))
            at = values.gather(1, local.unsqueeze(1)).squeeze(1).to(torch.float32)
            picked = torch.where(owned, at, picked)
        self._collectives.all_reduce(picked, "sampling")
        return picked

    def exclude(self, scores: Tensor, token_ids: Tensor) -> Tensor:
        owned = (token_ids >= self.shard.start) & (token_ids < self.shard.stop)
        if scores.shape[1] == 0:
            return scores.clone()
        local = torch.where(owned, token_ids - self.first, torch.zeros_like(token_ids))
        current = scores.gather(1, local.unsqueeze(1))
        marked = torch.where(owned.unsqueeze(1), -math.inf, current)
        return scores.scatter(1, local.unsqueeze(1), marked)

    def cutoff(self, scaled: Tensor, tensors: SamplingTensors) -> Tensor:
        rows, width = scaled.shape
        vocab = self.shard.vocab_size
        candidates = CUTOFF_CANDIDATES
        words = torch.full((rows, candidates + 2), -math.inf, device=scaled.device)
        best = min(candidates, width)
        if best:
            words[:, :best] = scaled.topk(best, dim=1).values
        words[:, candidates], words[:, candidates + 1] = self._statistics(scaled)
        gathered = self._collectives.all_gather(words, "sampling")  # [world, R, C + 2]
        widths = torch.tensor(
            [stop - start for start, stop in self._ranges()], device=scaled.device
        )
        truncated = widths > candidates  # ranks that held back some of their values
        sent = gathered[:, :, :candidates]
        last_sent = torch.where(truncated[:, None], sent[:, :, -1], -math.inf)
        # Every value >= `floor` of every rank is among the merged candidates.
        floor = last_sent.amax(dim=0)
        merged = sent.permute(1, 0, 2).reshape(rows, -1).sort(dim=1, descending=True).values
        top_k = tensors.top_k.to(torch.int64)
        top_k = torch.where((top_k <= 0) | (top_k >= vocab), vocab, top_k)
        k_active = top_k < vocab
        kth = merged.gather(1, (top_k.clamp(max=merged.shape[1]) - 1).unsqueeze(1)).squeeze(1)
        k_cutoff = torch.where(k_active, kth, -math.inf)
        k_exact = ~k_active | ((top_k <= merged.shape[1]) & (kth > floor))
        kept_values = torch.where(merged >= k_cutoff.unsqueeze(1), merged, -math.inf)
        # The normalizer of what top_k keeps: the kept candidates, or the whole vocabulary.
        candidate_lse = torch.logsumexp(kept_values, dim=1)
        whole_lse = self._log_normalizer(gathered[:, :, candidates], gathered[:, :, candidates + 1])
        lse = torch.where(k_active, candidate_lse, whole_lse)
        probs = (kept_values - lse.unsqueeze(1)).exp()
        mass_before = torch.nn.functional.pad(probs.cumsum(dim=1)[:, :-1], (1, 0))
        p_active = tensors.top_p < 1.0
        kept = (mass_before < tensors.top_p.unsqueeze(1)).sum(dim=1).clamp(min=1)
        pth = merged.gather(1, (kept - 1).unsqueeze(1)).squeeze(1)
        p_cutoff = torch.where(p_active, pth, -math.inf)
        # The count stops short of the candidates, so the next true value ends the kept run.
        p_exact = ~p_active | ((kept < merged.shape[1]) & (pth > floor))
        cutoff = torch.maximum(k_cutoff, p_cutoff)
        inexact = ~(k_exact & p_exact) & torch.isfinite(floor)
        if bool(inexact.any()):
            cutoff = self._gathered_cutoff(scaled, tensors, inexact, cutoff)
        return cutoff.unsqueeze(1)

    def _ranges(self) -> list[tuple[int, int]]:
        stops = self.shard.stops
        return [(stops[r - 1] if r else 0, stops[r]) for r in range(self.shard.world_size)]

    def _gathered_cutoff(
        self, scaled: Tensor, tensors: SamplingTensors, inexact: Tensor, cutoff: Tensor
    ) -> Tensor:
        """The whole-row cutoff of rows the candidates cannot settle, from their gathered rows.

        Every rank computes the same `inexact` from the same exchange, so all take part.
        """
        rows = torch.nonzero(inexact).squeeze(1)
        widest = max(stop - start for start, stop in self._ranges())
        block = torch.full((rows.numel(), widest), -math.inf, device=scaled.device)
        block[:, : scaled.shape[1]] = scaled.index_select(0, rows)
        gathered = self._collectives.all_gather(block, "sampling rows gathered")
        whole = torch.cat(
            [gathered[r, :, : stop - start] for r, (start, stop) in enumerate(self._ranges())],
            dim=1,
        )
        self.gathered_rows += rows.numel()
        settled = top_k_top_p_cutoff(
            whole, tensors.top_k.index_select(0, rows), tensors.top_p.index_select(0, rows)
        ).squeeze(1)
        return cutoff.index_copy(0, rows, settled)
