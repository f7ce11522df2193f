"""The routed-experts MLP: top-k routing, stacked expert weights and a fixed-order routed sum."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from adapters.gpu.distributed.collectives import Collectives
from adapters.gpu.model.layer_ops import Linear
from adapters.gpu.model.moe_config import ExpertsSettings


def top_indices(values: torch.Tensor, count: int) -> torch.Tensor:
    """Indices [N, count] of each row's `count` largest values, largest first; equal values
    go to the lowest index (a stable sort), so a tie never depends on the kernel or the batch."""
    return torch.sort(values, dim=-1, descending=True, stable=True).indices[:, :count]


def split_columns(total: int, world_size: int, rank: int) -> tuple[int, int]:
    """[start, stop) of the inner columns of every expert that `rank` holds (shard split)."""
    base, extra = divmod(total, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


class RoutedExperts(nn.Module):
    """A sparse MLP: each row goes through its top-k experts, weighted, plus any shared expert.

    Expert weights are stacked once per layer: `gate_up_weight` [E, 2 * inner, hidden] (gate
    rows, then up rows) and `down_weight` [E, hidden, inner]. Router logits and scores are
    float32. The routed sum of a row adds its experts' weighted outputs in ascending expert
    index whatever the batch (see docs/moe.md); under tensor parallelism every rank holds the
    columns `columns` of each expert (and of the shared expert) and the partial sums of the
    ranks are added by one all-reduce. `routing_log`, when a list, receives each forward's
    chosen experts [N, k] (ascending per row).
    """

    def __init__(
        self,
        settings: ExpertsSettings,
        hidden: int,
        dtype: torch.dtype,
        device: torch.device,
        *,
        rank: int = 0,
        world_size: int = 1,
        collectives: Collectives | None = None,
        linear: Linear = F.linear,
    ) -> None:
        super().__init__()
        self.settings = settings
        self._collectives = collectives
        self._linear = linear  # the layer's matmul kernel (batch-invariant or plain)
        count = settings.num_experts
        start, stop = split_columns(settings.inner, world_size, rank)
        inner = stop - start
        self.columns = (start, stop)
        self.router_weight = _parameter((count, hidden), torch.float32, device)
        self.correction_bias = (
            _parameter((count,), torch.float32, device) if settings.correction_bias else None
        )
        self.gate_up_weight = _parameter((count, 2 * inner, hidden), dtype, device)
        self.down_weight = _parameter((count, hidden, inner), dtype, device)
        self.shared_gate_up_weight = self.shared_down_weight = self.shared_gate_weight = None
        if settings.shared_inner:
            first, last = split_columns(settings.shared_inner, world_size, rank)
            self.shared_columns = (first, last)
            shared = last - first
            self.shared_gate_up_weight = _parameter((2 * shared, hidden), dtype, device)
            self.shared_down_weight = _parameter((hidden, shared), dtype, device)
            if settings.shared_gate:
                self.shared_gate_weight = _parameter((1, hidden), dtype, device)
        self.routing_log: list[torch.Tensor] | None = None

    def route(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(experts [N, k] in score order, their float32 weights [N, k]) of `rows` [N, hidden]."""
        settings = self.settings
        logits = self._linear(rows.float(), self.router_weight)
        scores = logits.softmax(dim=-1) if settings.scoring == "softmax" else _sigmoid(logits)
        choice = scores if self.correction_bias is None else scores + self.correction_bias
        if settings.groups > 1:
            grouped = choice.view(rows.shape[0], settings.groups, -1)
            best_two = grouped.topk(2, dim=-1).values.sum(dim=-1)
            kept = torch.zeros_like(best_two, dtype=torch.bool)
            kept.scatter_(1, top_indices(best_two, settings.top_groups), True)
            choice = grouped.masked_fill(~kept[:, :, None], float("-inf")).flatten(1)
        experts = top_indices(choice, settings.top_k)
        weights = scores.gather(1, experts)
        if settings.normalize:
            # DeepSeek guards the division; softmax scores never sum to zero.
            guard = 1e-20 if settings.scoring == "sigmoid" else 0.0
            weights = weights / (weights.sum(dim=-1, keepdim=True) + guard)
        if settings.scaling != 1.0:
            weights = weights * settings.scaling
        return experts, weights

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        """The layer's MLP output [N, hidden] of normed `rows` [N, hidden]."""
        experts, weights = self.route(rows)
        order = experts.argsort(dim=-1, stable=True)
        experts, weights = experts.gather(1, order), weights.gather(1, order)
        if self.routing_log is not None:
            self.routing_log.append(experts.clone())
        count, top_k = experts.shape
        flat = experts.flatten()
        by_expert = flat.argsort(stable=True)
        sizes = torch.bincount(flat, minlength=self.settings.num_experts).tolist()
        flat_weights = weights.flatten()
        outputs = rows.new_empty((count * top_k, rows.shape[1]))
        linear = self._linear
        start = 0
        for expert, size in enumerate(sizes):
            if not size:
                continue
            picks = by_expert[start : start + size]
            start += size
            inputs = rows.index_select(0, picks // top_k)
            gate, up = linear(inputs, self.gate_up_weight[expert]).chunk(2, dim=-1)
            out = linear(F.silu(gate) * up, self.down_weight[expert])
            scaled = out.float() * flat_weights.index_select(0, picks)[:, None]
            outputs.index_copy_(0, picks, scaled.to(rows.dtype))
        slots = outputs.view(count, top_k, -1)
        # Slot s holds the row's s-th smallest expert: a fixed order of addition per row.
        total = slots[:, 0]
        for slot in range(1, top_k):
            total = total + slots[:, slot]
        if self.shared_gate_up_weight is not None and self.shared_down_weight is not None:
            total = total + self._shared(rows, self.shared_gate_up_weight, self.shared_down_weight)
        if self._collectives is not None:
            total = total.contiguous()
            self._collectives.all_reduce(total, "model")
        return total

    def _shared(
        self, rows: torch.Tensor, gate_up_weight: torch.Tensor, down_weight: torch.Tensor
    ) -> torch.Tensor:
        gate, up = self._linear(rows, gate_up_weight).chunk(2, dim=-1)
        out = self._linear(F.silu(gate) * up, down_weight)
        if self.shared_gate_weight is not None:
            out = _sigmoid(self._linear(rows, self.shared_gate_weight)) * out
        return out

    def gemm_weights(self) -> list[torch.Tensor]:
        """One weight of each matmul shape this module runs."""
        weights: list[torch.Tensor] = [
            self.router_weight,
            self.gate_up_weight[0],
            self.down_weight[0],
        ]
        for shared in (self.shared_gate_up_weight, self.shared_down_weight):
            if shared is not None:
                weights.append(shared)
        return weights


# Elements per row the sigmoid sees: CPU kernels take a vectorised path for whole vectors and a
# scalar one for a tensor's tail, which round differently, so every row is padded to whole
# vectors and never lands in a tail, however many rows share the call.
_SIGMOID_ROW_GRANULE = 64


def _sigmoid(logits: torch.Tensor) -> torch.Tensor:
    width = logits.shape[-1]
    padding = -width % _SIGMOID_ROW_GRANULE
    if not padding:
        return logits.sigmoid()
    return F.pad(logits, (0, padding)).sigmoid()[:, :width]


def _parameter(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)
