"""Multi-head latent attention (DeepSeek V3) over a compressed paged cache of latents."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from adapters.gpu.distributed.collectives import Collectives
from adapters.gpu.model.attention import AttentionMasks, paged_attention
from adapters.gpu.model.forward_batch import ForwardBatch
from adapters.gpu.model.invariant import invariant_linear
from adapters.gpu.model.layer_ops import Linear, rms_norm, row_parallel
from adapters.gpu.model.moe_config import LatentAttentionSettings
from adapters.gpu.model.rope import apply_rotary

# DeepSeek's latent norms use this epsilon whatever the config's rms_norm_eps says.
LATENT_NORM_EPS = 1e-6


def _parameter(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


class LatentAttention(nn.Module):
    """MLA in its absorbed form: one shared key/value "head" per token, the cached row
    [latent (kv_lora_rank) | rotated key (rope_dim)], and per-head queries mapped into it.

    A head's score is q_nope . (W_k latent) + q_rope . k_rope; this computes it as
    (W_k^T q_nope) . latent + q_rope . k_rope, so attention reads only the compressed cache
    (the key cache doubles as the value cache: the latent is the first kv_lora_rank elements
    of each row). A head's output is W_v applied to its attention-weighted latent. Weights keep
    the checkpoint's layout (rotary rows already permuted to rotate-half by the loader); under
    tensor parallelism the layer holds `num_heads` of the heads, every rank the whole latent.
    """

    def __init__(
        self,
        settings: LatentAttentionSettings,
        hidden: int,
        num_heads: int,
        *,
        bias: bool,
        dtype: torch.dtype,
        device: torch.device,
        collectives: Collectives | None = None,
        batch_invariant: bool = False,
    ) -> None:
        super().__init__()
        self.settings = settings
        self.num_heads = num_heads
        self._collectives = collectives
        self._invariant = batch_invariant
        self._linear: Linear = invariant_linear if batch_invariant else F.linear
        query_width = num_heads * (settings.nope_dim + settings.rope_dim)
        rank = settings.q_lora_rank
        self.q_a_weight = self.q_a_bias = self.q_a_norm = None
        if rank is None:
            self.q_weight = _parameter((query_width, hidden), dtype, device)
        else:
            self.q_a_weight = _parameter((rank, hidden), dtype, device)
            self.q_a_bias = _parameter((rank,), dtype, device) if bias else None
            self.q_a_norm = _parameter((rank,), dtype, device)
            self.q_weight = _parameter((query_width, rank), dtype, device)
        self.kv_a_weight = _parameter((settings.cache_width, hidden), dtype, device)
        self.kv_a_bias = _parameter((settings.cache_width,), dtype, device) if bias else None
        self.kv_a_norm = _parameter((settings.kv_lora_rank,), dtype, device)
        per_head = settings.nope_dim + settings.value_dim
        self.kv_b_weight = _parameter((num_heads * per_head, settings.kv_lora_rank), dtype, device)
        self.output_weight = _parameter((hidden, num_heads * settings.value_dim), dtype, device)
        self.output_bias = _parameter((hidden,), dtype, device) if bias else None

    def forward(
        self,
        normed: torch.Tensor,  # [N, hidden]
        cos: torch.Tensor,  # [N, 1, rope_dim]
        signed_sin: torch.Tensor,
        batch: ForwardBatch,
        cache: torch.Tensor,  # [rows, 1, kv_lora_rank + rope_dim]
        masks: AttentionMasks,
    ) -> torch.Tensor:
        """The attention block's output [N, hidden] (before the residual)."""
        settings, linear = self.settings, self._linear
        count, heads, rank = normed.shape[0], self.num_heads, settings.kv_lora_rank
        if self.q_a_weight is None or self.q_a_norm is None:
            queries = linear(normed, self.q_weight)
        else:
            compressed = linear(normed, self.q_a_weight, self.q_a_bias)
            queries = linear(rms_norm(compressed, self.q_a_norm, LATENT_NORM_EPS), self.q_weight)
        queries = queries.view(count, heads, -1)
        q_nope, q_rope = queries.split([settings.nope_dim, settings.rope_dim], dim=-1)
        shared = linear(normed, self.kv_a_weight, self.kv_a_bias)
        latent = rms_norm(shared[:, :rank], self.kv_a_norm, LATENT_NORM_EPS)
        k_rope = apply_rotary(shared[:, None, rank:], cos, signed_sin)
        absorbed = self._per_head(q_nope, self._key_maps())  # [N, heads, rank]
        rows = torch.cat((absorbed, apply_rotary(q_rope, cos, signed_sin)), dim=-1)
        keys = torch.cat((latent[:, None], k_rope), dim=-1)
        attended = paged_attention(
            rows, keys, keys, cache, cache, batch, masks, settings.softmax_scale, self._invariant
        ).view(count, heads, -1)[..., :rank]
        values = self._per_head(attended, self._value_maps())  # [N, heads, value_dim]
        return row_parallel(
            values.reshape(count, -1),
            self.output_weight,
            self.output_bias,
            self._collectives,
            linear,
        )

    def _key_maps(self) -> torch.Tensor:
        """Per head, the map [rank, nope] taking a query's no-rope part into latent space."""
        settings = self.settings
        per_head = self.kv_b_weight.view(self.num_heads, -1, settings.kv_lora_rank)
        return per_head[:, : settings.nope_dim].transpose(1, 2)

    def _value_maps(self) -> torch.Tensor:
        """Per head, the map [value_dim, rank] taking an attended latent to the head's value."""
        per_head = self.kv_b_weight.view(self.num_heads, -1, self.settings.kv_lora_rank)
        return per_head[:, self.settings.nope_dim :]

    def _per_head(self, rows: torch.Tensor, maps: torch.Tensor) -> torch.Tensor:
        """rows [N, heads, in] through each head's own map [heads, out, in]: [N, heads, out].

        Batch-invariant mode runs one padded GEMM per head, whose bits do not depend on N."""
        if self._invariant:
            outputs = [
                invariant_linear(rows[:, head], maps[head].contiguous())
                for head in range(self.num_heads)
            ]
            return torch.stack(outputs, dim=1)
        return torch.bmm(rows.transpose(0, 1), maps.transpose(1, 2)).transpose(0, 1)

    def gemm_weights(self) -> list[torch.Tensor]:
        """One weight of each matmul shape this module runs."""
        weights: list[torch.Tensor] = [self.q_weight, self.kv_a_weight, self.output_weight]
        if self.q_a_weight is not None:
            weights.append(self.q_a_weight)
        weights += [self._key_maps()[0].contiguous(), self._value_maps()[0].contiguous()]
        return weights
