"""The Llama-family decoder (Llama, Qwen2/3, Mistral, Phi-3, Gemma 3, and the MoE families)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from adapters.gpu.distributed.collectives import Collectives
from adapters.gpu.distributed.split import RankSplit
from adapters.gpu.model.attention import AttentionMasks, paged_attention
from adapters.gpu.model.config import ModelConfig
from adapters.gpu.model.experts import RoutedExperts
from adapters.gpu.model.forward_batch import ForwardBatch
from adapters.gpu.model.invariant import invariant_linear
from adapters.gpu.model.kv_cache import PagedKVCache
from adapters.gpu.model.latent_attention import LatentAttention
from adapters.gpu.model.layer_ops import Linear, rms_norm
from adapters.gpu.model.layer_ops import row_parallel as _row_parallel
from adapters.gpu.model.rope import RotaryEmbedding, apply_rotary


def offset_rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's norm: normalised and scaled in float32 by `weight` (float32, holding the
    checkpoint's 1 + w), then cast to the model dtype."""
    as_float = hidden.to(torch.float32)
    variance = as_float.pow(2).mean(-1, keepdim=True)
    return (as_float * torch.rsqrt(variance + eps) * weight).to(hidden.dtype)


Norm = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]


def _norm_of(config: ModelConfig, dtype: torch.dtype) -> tuple[Norm, torch.dtype]:
    """The norm function and its weights' dtype: Gemma's offset norms scale in float32."""
    if config.norm_weight_offset:
        return offset_rms_norm, torch.float32
    return rms_norm, dtype


def _activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name == "gelu_pytorch_tanh":
        return lambda gate: F.gelu(gate, approximate="tanh")
    return F.silu


def _weight(*shape: int, dtype: torch.dtype, device: torch.device) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


def _optional(
    present: bool, size: int, dtype: torch.dtype, device: torch.device
) -> nn.Parameter | None:
    return _weight(size, dtype=dtype, device=device) if present else None


class DecoderLayer(nn.Module):
    """Pre-norm attention and gated MLP (SiLU or GeLU-tanh) blocks with residuals; with the
    config's options, per-head q/k norms before the rotation and sandwich norms on each block's
    output (Gemma 3: `attention_out_norm`, `mlp_out_norm`; `post_attention_norm` is always the
    norm in front of the MLP).

    q/k/v and gate/up projections are fused into one matmul each; the loader concatenates
    the checkpoint's separate weights in that order. Under tensor parallelism `config` holds
    this rank's heads and MLP columns (column-parallel q/k/v and gate/up, row-parallel output
    and down projections joined by an all-reduce). `batch_invariant` takes the kernels of
    `adapters.gpu.model.invariant` for every matmul and the attention.

    A sparse layer (`config.experts`) routes its MLP through `experts` and a latent-attention
    model replaces q/k/v with `latent`; the weights those replace are then empty.
    """

    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype,
        device: torch.device,
        collectives: Collectives | None = None,
        batch_invariant: bool = False,
        layer_index: int = 0,
        split: RankSplit | None = None,
    ) -> None:
        super().__init__()
        self._collectives = collectives
        self._invariant = batch_invariant
        self._linear: Linear = invariant_linear if batch_invariant else F.linear
        hidden = config.hidden_size
        head_dim = config.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = head_dim
        self.eps = config.rms_norm_eps
        self.scale = config.attention_multiplier or head_dim**-0.5
        self._norm, norm_dtype = _norm_of(config, dtype)
        self._act = _activation(config.hidden_act)
        qkv_size = (self.num_heads + 2 * self.num_kv_heads) * head_dim
        inner = config.intermediate_size
        linear = self._linear
        self.experts = _experts(config, layer_index, dtype, device, split, collectives, linear)
        self.latent = _latent(config, dtype, device, collectives, batch_invariant)
        if self.experts is not None:
            inner = 0
        attention_width = 0 if self.latent is not None else self.num_heads * head_dim
        if self.latent is not None:
            qkv_size = 0
        self.input_norm = _weight(hidden, dtype=norm_dtype, device=device)
        self.qkv_weight = _weight(qkv_size, hidden, dtype=dtype, device=device)
        self.qkv_bias = _optional(config.attention_bias, qkv_size, dtype, device)
        self.output_weight = _weight(hidden, attention_width, dtype=dtype, device=device)
        self.output_bias = _optional(config.output_bias, hidden, dtype, device)
        self.post_attention_norm = _weight(hidden, dtype=norm_dtype, device=device)
        self.q_norm = _optional(config.qk_norm, head_dim, norm_dtype, device)
        self.k_norm = _optional(config.qk_norm, head_dim, norm_dtype, device)
        self.attention_out_norm = _optional(config.sandwich_norms, hidden, norm_dtype, device)
        self.mlp_out_norm = _optional(config.sandwich_norms, hidden, norm_dtype, device)
        self.gate_up_weight = _weight(2 * inner, hidden, dtype=dtype, device=device)
        self.gate_up_bias = _optional(config.mlp_bias, 2 * inner, dtype, device)
        self.down_weight = _weight(hidden, inner, dtype=dtype, device=device)
        self.down_bias = _optional(config.mlp_bias, hidden, dtype, device)

    def forward(
        self,
        hidden: torch.Tensor,  # [N, hidden]
        cos: torch.Tensor,  # [N, 1, head_dim]
        signed_sin: torch.Tensor,  # [N, 1, head_dim]
        batch: ForwardBatch,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        masks: AttentionMasks,
    ) -> torch.Tensor:
        num_rows = hidden.shape[0]
        rotated_heads = self.num_heads + self.num_kv_heads
        norm = self._norm
        normed = norm(hidden, self.input_norm, self.eps)
        linear = self._linear
        if self.latent is not None:
            attended = self.latent(normed, cos, signed_sin, batch, key_cache, masks)
            return self._feed_forward(hidden + attended)
        qkv = linear(normed, self.qkv_weight, self.qkv_bias).view(num_rows, -1, self.head_dim)
        heads = qkv[:, :rotated_heads]
        if self.q_norm is not None and self.k_norm is not None:
            queries = norm(heads[:, : self.num_heads], self.q_norm, self.eps)
            keys = norm(heads[:, self.num_heads :], self.k_norm, self.eps)
            heads = torch.cat((queries, keys), dim=1)
        # Queries and keys are adjacent heads, so one rotation covers both.
        rotated = apply_rotary(heads, cos, signed_sin)
        attended = paged_attention(
            rotated[:, : self.num_heads],
            rotated[:, self.num_heads :],
            qkv[:, rotated_heads:],
            key_cache,
            value_cache,
            batch,
            masks,
            self.scale,
            self._invariant,
        )
        reduce = self._collectives
        attention = _row_parallel(attended, self.output_weight, self.output_bias, reduce, linear)
        if self.attention_out_norm is not None:
            attention = norm(attention, self.attention_out_norm, self.eps)
        return self._feed_forward(hidden + attention)

    def _feed_forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """The post-attention norm and MLP (dense or routed) with its residual."""
        norm, linear = self._norm, self._linear
        normed = norm(hidden, self.post_attention_norm, self.eps)
        if self.experts is not None:
            mlp = self.experts(normed)
        else:
            gate, up = linear(normed, self.gate_up_weight, self.gate_up_bias).chunk(2, dim=-1)
            mlp = _row_parallel(
                self._act(gate) * up, self.down_weight, self.down_bias, self._collectives, linear
            )
        if self.mlp_out_norm is not None:
            mlp = norm(mlp, self.mlp_out_norm, self.eps)
        return hidden + mlp

    def gemm_weights(self) -> list[torch.Tensor]:
        """One weight of each matmul shape the layer runs."""
        dense = (self.qkv_weight, self.output_weight, self.gate_up_weight, self.down_weight)
        weights: list[torch.Tensor] = [weight for weight in dense if weight.numel()]
        for module in (self.experts, self.latent):
            if module is not None:
                weights += module.gemm_weights()
        return weights


def _experts(
    config: ModelConfig,
    layer_index: int,
    dtype: torch.dtype,
    device: torch.device,
    split: RankSplit | None,
    collectives: Collectives | None,
    linear: Linear,
) -> RoutedExperts | None:
    settings = config.experts
    if settings is None or not settings.sparse_layers[layer_index]:
        return None
    rank, world_size = (0, 1) if split is None else (split.rank, split.world_size)
    return RoutedExperts(
        settings,
        config.hidden_size,
        dtype,
        device,
        rank=rank,
        world_size=world_size,
        collectives=collectives,
        linear=linear,
    )


def _latent(
    config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    collectives: Collectives | None,
    batch_invariant: bool,
) -> LatentAttention | None:
    if config.latent_attention is None:
        return None
    return LatentAttention(
        config.latent_attention,
        config.hidden_size,
        config.num_attention_heads,
        bias=config.attention_bias,
        dtype=dtype,
        device=device,
        collectives=collectives,
        batch_invariant=batch_invariant,
    )


class DecoderModel(nn.Module):
    """Embedding, decoder layers, final norm and LM head over a paged KV cache.

    A forward runs every chunk of a `ForwardBatch` at once: for each layer it writes the new
    keys/values at `slot_mapping`, attends decode rows in one batched call and prompt chunks in
    another, and returns final-normed hidden states; `compute_logits` applies the LM head to
    the rows that are sampled. Parameters start uninitialised; `weights.load_model` fills them.

    With a `split` over several ranks, `collectives` joins them: the model holds that rank's
    heads and MLP columns and its vocabulary lanes [start, stop) of the embedding and the LM
    head; `compute_logits` returns only those lanes, and no rank ever holds a full row.

    `batch_invariant` makes every row's hidden state and logits independent of the batch: which
    rows share the forward, how a prompt was chunked, how many rows a speculative round feeds
    (see `adapters.gpu.model.invariant`); rotary tables come from one table of every position.

    `context_length` is the longest sequence served (default: the config's positions); rope
    variants that depend on it (longrope) take it from here. Sliding-window layers rotate with
    their own plain rope when the config has `local_rope_theta` (Gemma 3), and final logits are
    soft-capped where the config says so: the capped values are the model's raw logits.
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        dtype: torch.dtype,
        device: torch.device,
        split: RankSplit | None = None,
        collectives: Collectives | None = None,
        batch_invariant: bool = False,
        context_length: int | None = None,
    ) -> None:
        super().__init__()
        if split is not None and not split.whole and collectives is None:
            raise ValueError("a model split over several ranks needs their collectives")
        self.batch_invariant = batch_invariant
        self._linear: Linear = invariant_linear if batch_invariant else F.linear
        self.split = None if split is None or split.whole else split
        self.collectives = collectives if self.split is not None else None
        self.config = self.split.local_config(config) if self.split is not None else config
        self.dtype = dtype
        self.device = torch.device(device)
        self.vocab_lanes = self.split.vocab if self.split is not None else (0, config.vocab_size)
        vocab, hidden = self.vocab_lanes[1] - self.vocab_lanes[0], config.hidden_size
        self.embed_weight = _weight(vocab, hidden, dtype=dtype, device=self.device)
        self.layers = nn.ModuleList(
            DecoderLayer(
                self.config, dtype, self.device, self.collectives, batch_invariant, index, split
            )
            for index in range(config.num_hidden_layers)
        )
        self._norm, norm_dtype = _norm_of(config, dtype)
        self.norm_weight = _weight(hidden, dtype=norm_dtype, device=self.device)
        if config.tie_word_embeddings:
            self.lm_head_weight = self.embed_weight
        else:
            self.lm_head_weight = _weight(vocab, hidden, dtype=dtype, device=self.device)
        self.rotary = RotaryEmbedding(
            config, self.device, tabulated=batch_invariant, context_length=context_length
        )
        self.local_rotary: RotaryEmbedding | None = None
        if config.local_rope_theta is not None:
            plain = dataclasses.replace(
                config, rope_theta=config.local_rope_theta, rope_scaling=None
            )
            self.local_rotary = RotaryEmbedding(plain, self.device, tabulated=batch_invariant)
        self._windows = config.sliding_windows
        self._groups = self.config.num_query_groups

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv_cache: PagedKVCache) -> torch.Tensor:
        """Final-normed hidden states [N, hidden] of every row of `batch`."""
        self._check(batch, kv_cache)
        hidden = self._embed(batch.input_ids)
        multiplier = self.config.embedding_multiplier
        if multiplier is not None:
            # transformers rounds the multiplier to the model dtype before scaling.
            hidden = hidden * torch.tensor(multiplier, dtype=self.dtype, device=self.device)
        rotations: dict[int | None, tuple[torch.Tensor, ...]] = {
            None: self.rotary.cos_sin(batch.positions, self.dtype)
        }
        if self.local_rotary is not None:
            local = self.local_rotary.cos_sin(batch.positions, self.dtype)
            rotations.update({w: local for w in self._windows if w is not None})
        fresh = not self.batch_invariant
        masks = {
            window: AttentionMasks.build(batch, self._groups, window, allow_fresh=fresh)
            for window in set(self._windows)
        }
        for index, layer in enumerate(self.layers):
            cos, signed_sin = rotations.get(self._windows[index], rotations[None])
            hidden = layer(
                hidden,
                cos,
                signed_sin,
                batch,
                kv_cache.keys[index],
                kv_cache.values[index],
                masks[self._windows[index]],
            )
        return self._norm(hidden, self.norm_weight, self.config.rms_norm_eps)

    def gemm_weights(self) -> list[torch.Tensor]:
        """One weight of each matmul shape the model runs (every layer's, the LM head)."""
        shapes: dict[tuple[tuple[int, ...], torch.dtype], torch.Tensor] = {}
        for module in self.layers:
            for weight in cast(DecoderLayer, module).gemm_weights():
                shapes.setdefault((tuple(weight.shape), weight.dtype), weight)
        return [*shapes.values(), self.lm_head_weight]

    def _embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Embedding rows; a split model looks up the IDs it owns and sums the ranks' rows
        (exact: every other rank adds zeros)."""
        if self.collectives is None:
            return F.embedding(token_ids, self.embed_weight)
        start, stop = self.vocab_lanes
        owned = (token_ids >= start) & (token_ids < stop)
        hidden = torch.zeros(
            (token_ids.shape[0], self.config.hidden_size), dtype=self.dtype, device=self.device
        )
        if stop > start:
            local = torch.where(owned, token_ids - start, torch.zeros_like(token_ids))
            looked_up = F.embedding(local, self.embed_weight)
            hidden = torch.where(owned[:, None], looked_up, hidden)
        self.collectives.all_reduce(hidden, "model")
        return hidden

    @torch.inference_mode()
    def compute_logits(self, hidden_rows: torch.Tensor) -> torch.Tensor:
        """Float32 logits [R, lanes] of final-normed hidden rows [R, hidden]: the whole model
        vocabulary, or a split model's own vocabulary lanes; soft-capped (in float32) where the
        config caps them."""
        logits = self._linear(hidden_rows, self.lm_head_weight).float()
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def _check(self, batch: ForwardBatch, kv_cache: PagedKVCache) -> None:
        if batch.block_size != kv_cache.block_size:
            raise ValueError(
                f"batch built for block size {batch.block_size}, cache has {kv_cache.block_size}"
            )
        if batch.max_block_id >= kv_cache.num_blocks:
            raise ValueError(
                f"block {batch.max_block_id} is outside the cache's {kv_cache.num_blocks} blocks"
            )
        if batch.max_token_id >= self.config.vocab_size:
            raise ValueError(
                f"token ID {batch.max_token_id} is outside the vocabulary "
                f"({self.config.vocab_size})"
            )
        if kv_cache.num_layers != len(self.layers):
            raise ValueError(
                f"cache has {kv_cache.num_layers} layers, model has {len(self.layers)}"
            )
        if kv_cache.dtype != self.dtype:
            raise ValueError(f"cache dtype {kv_cache.dtype} differs from model dtype {self.dtype}")
