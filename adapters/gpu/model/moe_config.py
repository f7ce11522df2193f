"""Mixture-of-experts and latent-attention settings, read from a Hugging Face `config.json`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Architecture name -> flavour, for the families whose MLP routes tokens to experts.
MOE_ARCHITECTURES = {
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "MixtralForCausalLM": "mixtral",
    "DeepseekV3ForCausalLM": "deepseek_v3",
}
SCORINGS = frozenset({"softmax", "sigmoid"})


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class ExpertsSettings:
    """How a sparse layer routes each token.

    `scoring` turns router logits into scores: "softmax" over all experts, or an independent
    "sigmoid" per expert. With `groups` > 1 the experts split into that many equal groups and a
    token picks among the `top_groups` groups whose two best (bias-corrected) scores sum
    highest. `correction_bias` adds a learned per-expert bias to the scores for the choice
    only; the weights come from the unbiased scores. `normalize` divides the chosen weights by
    their sum; `scaling` multiplies them after. `shared_inner` is the width of an always-on
    shared expert (0: none); `shared_gate` scales it by sigmoid(hidden . gate).
    `sparse_layers[i]` says whether layer i routes (False: an ordinary dense MLP).
    """

    num_experts: int
    top_k: int
    inner: int
    sparse_layers: tuple[bool, ...]
    scoring: str = "softmax"
    normalize: bool = True
    scaling: float = 1.0
    groups: int = 1
    top_groups: int = 1
    correction_bias: bool = False
    shared_inner: int = 0
    shared_gate: bool = False

    def __post_init__(self) -> None:
        for name in ("num_experts", "top_k", "inner", "groups", "top_groups"):
            _positive(name, getattr(self, name))
        if self.top_k > self.num_experts:
            raise ValueError(
                f"num_experts_per_tok ({self.top_k}) exceeds the {self.num_experts} experts"
            )
        if self.scoring not in SCORINGS:
            raise ValueError(
                f"unsupported expert scoring {self.scoring!r}; supported: softmax, sigmoid"
            )
        if self.num_experts % self.groups:
            raise ValueError(f"{self.num_experts} experts do not split into {self.groups} groups")
        if self.top_groups > self.groups:
            raise ValueError(f"topk_group ({self.top_groups}) exceeds n_group ({self.groups})")
        if self.groups > 1 and (self.num_experts // self.groups < 2):
            raise ValueError("group-limited routing needs at least 2 experts per group")
        if self.groups > 1 and self.top_k > self.top_groups * (self.num_experts // self.groups):
            raise ValueError(
                f"num_experts_per_tok ({self.top_k}) exceeds the experts of "
                f"{self.top_groups} groups"
            )
        if self.shared_inner < 0:
            raise ValueError(
                f"the shared expert width must not be negative, got {self.shared_inner}"
            )


@dataclass(frozen=True)
class LatentAttentionSettings:
    """Multi-head latent attention (DeepSeek V2/V3) shapes.

    Queries come from `q_lora_rank` latents (None: a direct projection); keys and values from a
    `kv_lora_rank` latent shared by all heads, plus one shared `rope_dim` rotary key. The cache
    keeps only that latent and rotary key per token. `interleaved_rope` says the checkpoint
    pairs rotary dimensions (0, 1), (2, 3), ...; the loader permutes them to rotate-half.
    `softmax_scale` multiplies query-key products (yarn's mscale folded in).
    """

    q_lora_rank: int | None
    kv_lora_rank: int
    nope_dim: int
    rope_dim: int
    value_dim: int
    interleaved_rope: bool
    softmax_scale: float

    def __post_init__(self) -> None:
        if self.q_lora_rank is not None:
            _positive("q_lora_rank", self.q_lora_rank)
        for name in ("kv_lora_rank", "nope_dim", "rope_dim", "value_dim"):
            _positive(name, getattr(self, name))
        if self.rope_dim % 2:
            raise ValueError(f"qk_rope_head_dim must be even, got {self.rope_dim}")

    @property
    def cache_width(self) -> int:
        """Elements cached per token and layer: the latent, then the rotary key."""
        return self.kv_lora_rank + self.rope_dim


def experts_from_hf(
    raw: Mapping[str, Any], flavour: str, num_layers: int
) -> ExpertsSettings | None:
    """The routing settings of a `config.json` of `flavour` (None for dense flavours)."""
    if flavour == "mixtral":
        return ExpertsSettings(
            num_experts=_get(raw, "num_local_experts"),
            top_k=_get(raw, "num_experts_per_tok"),
            inner=_get(raw, "intermediate_size"),
            sparse_layers=(True,) * num_layers,
        )
    if flavour in ("qwen2_moe", "qwen3_moe"):
        count = raw.get("num_experts") or _get(raw, "num_local_experts")
        step = raw.get("decoder_sparse_step") or 1
        dense = set(raw.get("mlp_only_layers") or ())
        shared = (raw.get("shared_expert_intermediate_size") or 0) if flavour == "qwen2_moe" else 0
        return ExpertsSettings(
            num_experts=count,
            top_k=_get(raw, "num_experts_per_tok"),
            inner=_get(raw, "moe_intermediate_size"),
            sparse_layers=tuple(i not in dense and (i + 1) % step == 0 for i in range(num_layers)),
            normalize=bool(raw.get("norm_topk_prob", False)),
            shared_inner=shared,
            shared_gate=bool(shared),
        )
    if flavour == "deepseek_v3":
        scoring = raw.get("scoring_func", "sigmoid")
        if scoring != "sigmoid":
            raise ValueError(f"unsupported DeepSeek scoring_func {scoring!r}; only 'sigmoid'")
        if raw.get("topk_method", "noaux_tc") != "noaux_tc":
            raise ValueError(f"unsupported DeepSeek topk_method {raw['topk_method']!r}")
        first_dense = raw.get("first_k_dense_replace") or 0
        inner = _get(raw, "moe_intermediate_size")
        return ExpertsSettings(
            num_experts=raw.get("n_routed_experts") or _get(raw, "num_local_experts"),
            top_k=_get(raw, "num_experts_per_tok"),
            inner=inner,
            sparse_layers=tuple(i >= first_dense for i in range(num_layers)),
            scoring="sigmoid",
            normalize=bool(raw.get("norm_topk_prob", True)),
            scaling=float(raw.get("routed_scaling_factor", 1.0)),
            groups=raw.get("n_group") or 1,
            top_groups=raw.get("topk_group") or 1,
            correction_bias=True,
            shared_inner=inner * (raw.get("n_shared_experts") or 0),
        )
    return None


def latent_attention_from_hf(
    raw: Mapping[str, Any], rope_scaling: Mapping[str, Any] | None
) -> LatentAttentionSettings:
    """DeepSeek V3's attention shapes; the softmax scale folds in yarn's `mscale_all_dim`."""
    nope, rope = _get(raw, "qk_nope_head_dim"), _get(raw, "qk_rope_head_dim")
    scale = (nope + rope) ** -0.5
    if rope_scaling is not None and rope_scaling.get("mscale_all_dim"):
        mscale = _yarn_mscale(float(rope_scaling["factor"]), float(rope_scaling["mscale_all_dim"]))
        scale *= mscale * mscale
    return LatentAttentionSettings(
        q_lora_rank=raw.get("q_lora_rank"),
        kv_lora_rank=_get(raw, "kv_lora_rank"),
        nope_dim=nope,
        rope_dim=rope,
        value_dim=_get(raw, "v_head_dim"),
        interleaved_rope=bool(raw.get("rope_interleave", True)),
        softmax_scale=scale,
    )


def _yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _get(raw: Mapping[str, Any], key: str) -> Any:
    if key not in raw or raw[key] is None:
        raise ValueError(f"config.json lacks required field {key!r}")
    return raw[key]
