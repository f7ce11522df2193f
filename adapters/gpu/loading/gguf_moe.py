"""GGUF names and metadata of llama.cpp's mixture-of-experts architectures, in HF spelling.

llama.cpp stores Mixtral as architecture "llama" with expert tensors, Qwen3-MoE as "qwen3moe"
and DeepSeek-V3 as "deepseek2". Experts come stacked ([experts, rows, columns]); they export
as `experts.gate_proj`, `experts.up_proj` and `experts.down_proj` of the layer's sparse block,
which `expert_weights.fill_experts` reads.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from typing import Any

MOE_GGUF_ARCHITECTURES = frozenset({"qwen3moe", "deepseek2"})
# llama.cpp's expert_gating_func values.
_GATING_SOFTMAX, _GATING_SIGMOID = 1, 2
_LAYER = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")

# Tensors every one of these architectures names alike (no Q/K row permutation undone).
_PLAIN = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_QWEN3_MOE = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
_DEEPSEEK = {
    "attn_q": "self_attn.q_proj",
    "attn_q_a": "self_attn.q_a_proj",
    "attn_q_a_norm": "self_attn.q_a_layernorm",
    "attn_q_b": "self_attn.q_b_proj",
    "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa",
    "attn_kv_a_norm": "self_attn.kv_a_layernorm",
    "attn_kv_b": "self_attn.kv_b_proj",
    "ffn_gate_shexp": "mlp.shared_experts.gate_proj",
    "ffn_up_shexp": "mlp.shared_experts.up_proj",
    "ffn_down_shexp": "mlp.shared_experts.down_proj",
}
# Tensors whose HF name carries no .weight/.bias suffix.
_BARE = {"exp_probs_b": "mlp.gate.e_score_correction_bias"}
_ROUTED = {
    "ffn_gate_inp": "gate",
    "ffn_gate_exps": "experts.gate_proj",
    "ffn_up_exps": "experts.up_proj",
    "ffn_down_exps": "experts.down_proj",
}

Key = Callable[..., Any]


def moe_config(
    architecture: str, key: Key, tensor_names: Collection[str], config: dict[str, Any]
) -> None:
    """Turns the llama-style `config` of a GGUF into its MoE family's HF config, in place;
    `key(name, default)` reads `{architecture}.{name}`. Dense architectures stay as they are."""
    count = int(key("expert_count", 0))
    if architecture not in MOE_GGUF_ARCHITECTURES:
        if architecture == "llama" and count:
            config.update(
                architectures=["MixtralForCausalLM"],
                model_type="mixtral",
                num_local_experts=count,
                num_experts_per_tok=int(key("expert_used_count")),
                sliding_window=None,
            )
        return
    layers = config["num_hidden_layers"]
    routed = [f"blk.{i}.ffn_gate_inp.weight" in tensor_names for i in range(layers)]
    if architecture == "qwen3moe":
        config.update(
            architectures=["Qwen3MoeForCausalLM"],
            model_type="qwen3_moe",
            num_experts=count,
            num_experts_per_tok=int(key("expert_used_count")),
            moe_intermediate_size=int(key("expert_feed_forward_length")),
            decoder_sparse_step=1,
            mlp_only_layers=[i for i in range(layers) if not routed[i]],
            norm_topk_prob=bool(key("expert_weights_norm", True)),
        )
        return
    gating = int(key("expert_gating_func", _GATING_SIGMOID))
    if gating != _GATING_SIGMOID:
        raise ValueError(f"DeepSeek expert gating function {gating} is not supported (sigmoid: 2)")
    rope = int(key("rope.dimension_count"))
    q_rank = int(key("attention.q_lora_rank", 0)) or None
    first_routed = routed.index(True) if any(routed) else layers
    config.update(
        architectures=["DeepseekV3ForCausalLM"],
        model_type="deepseek_v3",
        n_routed_experts=count,
        num_experts_per_tok=int(key("expert_used_count")),
        moe_intermediate_size=int(key("expert_feed_forward_length")),
        n_shared_experts=int(key("expert_shared_count", 0)),
        first_k_dense_replace=int(key("leading_dense_block_count", first_routed)),
        routed_scaling_factor=float(key("expert_weights_scale", 1.0)),
        norm_topk_prob=bool(key("expert_weights_norm", True)),
        n_group=int(key("expert_group_count", 1)),
        topk_group=int(key("expert_group_used_count", 1)),
        q_lora_rank=q_rank,
        kv_lora_rank=int(key("attention.kv_lora_rank")),
        qk_rope_head_dim=rope,
        qk_nope_head_dim=int(key("attention.key_length")) - rope,
        v_head_dim=int(key("attention.value_length")),
        head_dim=rope,
        rope_interleave=True,
    )
    scaling = key("rope.scaling.type", "none")
    if scaling == "yarn":
        # llama.cpp keeps 0.1 * mscale_all_dim; DeepSeek's configs set mscale alike.
        mscale = float(key("rope.scaling.yarn_log_multiplier", 0.0)) / 0.1
        config["rope_parameters"] = {
            "rope_type": "yarn",
            "rope_theta": config["rope_theta"],
            "factor": float(key("rope.scaling.factor")),
            "original_max_position_embeddings": int(key("rope.scaling.original_context_length")),
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": round(mscale, 6),
            "mscale_all_dim": round(mscale, 6),
        }
    elif scaling not in ("none", ""):
        raise ValueError(f"rope scaling {scaling!r} is not supported for deepseek2")


def moe_tensor_name(gguf_name: str, config: dict[str, Any]) -> tuple[str, None] | None:
    """The HF name of a GGUF tensor of a MoE family (None: not one this module names; the
    llama table then decides). Q/K rows of these tensors need no un-permuting."""
    match = _LAYER.fullmatch(gguf_name)
    model_type = config.get("model_type")
    if match is None or model_type not in ("mixtral", "qwen3_moe", "deepseek_v3"):
        return None
    layer, kind, suffix = match.groups()
    prefix = f"model.layers.{layer}."
    if kind in _ROUTED:
        block = "block_sparse_moe." if model_type == "mixtral" else "mlp."
        name = prefix + block + _ROUTED[kind]
        stacked = kind.endswith("_exps")
        return (name if stacked else f"{name}.{suffix}"), None
    if model_type == "mixtral":
        return None
    if model_type == "deepseek_v3" and kind in _BARE:
        return prefix + _BARE[kind], None
    table = {**_PLAIN, **(_QWEN3_MOE if model_type == "qwen3_moe" else _DEEPSEEK)}
    if kind not in table:
        return None
    return f"{prefix}{table[kind]}.{suffix}", None
