"""Builders of tiny random mixture-of-experts checkpoints (Qwen2/3-MoE, Mixtral, DeepSeek-V3)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.tiny_models import build_tiny

_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 512,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
# Qwen2-MoE and Qwen3-MoE: 8 routed experts of width 32, top-2.
_ROUTED = {
    **_SHAPE,
    "num_key_value_heads": 2,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
}
# DeepSeek-V3's yarn, as its checkpoints configure it (mscale folded into the softmax scale).
DEEPSEEK_YARN = {
    "rope_type": "yarn",
    "rope_theta": 10_000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 128,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}


def build_tiny_qwen3_moe(directory: Path | str, **options: Any) -> Path:
    """A random `Qwen3MoeForCausalLM`: 8 experts, top-2 with renormalised weights, per-head
    q/k norms, layer 0 dense (`mlp_only_layers`) and layer 1 sparse; `options` as
    tiny_models.build_tiny's."""
    settings = {**_ROUTED, "norm_topk_prob": True, "mlp_only_layers": [0]}
    return build_tiny("Qwen3MoeForCausalLM", directory, settings, **options)


def build_tiny_qwen2_moe(directory: Path | str, **options: Any) -> Path:
    """A random `Qwen2MoeForCausalLM`: q/k/v biases, 8 experts top-2 (weights not
    renormalised) and a shared expert of width 48 behind a sigmoid gate in both layers."""
    settings = {**_ROUTED, "shared_expert_intermediate_size": 48}
    return build_tiny("Qwen2MoeForCausalLM", directory, settings, **options)


def build_tiny_mixtral(directory: Path | str, **options: Any) -> Path:
    """A random `MixtralForCausalLM`: 4 experts of width 96, top-2, no sliding window unless
    `sliding_window` is given."""
    settings = {
        **_SHAPE,
        "num_key_value_heads": 2,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": None,
    }
    return build_tiny("MixtralForCausalLM", directory, settings, **options)


def build_tiny_deepseek_v3(directory: Path | str, **options: Any) -> Path:
    """A random `DeepseekV3ForCausalLM`: latent attention (q rank 32, kv rank 16, rotary 8,
    no-rope 16, value 12) with interleaved yarn rope, layer 0 dense, layer 1 routed over 8
    experts in 4 groups (2 groups kept, top-2, sigmoid scores with a correction bias, scaling
    2.5) plus one shared expert."""
    settings = {
        **_SHAPE,
        "num_key_value_heads": 4,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "n_group": 4,
        "topk_group": 2,
        "routed_scaling_factor": 2.5,
        "first_k_dense_replace": 1,
        "q_lora_rank": 32,
        "kv_lora_rank": 16,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 16,
        "v_head_dim": 12,
        "rope_parameters": dict(DEEPSEEK_YARN),
    }
    return build_tiny("DeepseekV3ForCausalLM", directory, settings, **options)
