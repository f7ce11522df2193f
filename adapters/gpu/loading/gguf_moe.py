"""GGUF names and metadata of llama.cpp's mixture-of-experts architectures, in HF spelling.

llama.cpp stores Mixtral as architecture "llama" with expert tensors, Qwen2-MoE as "qwen2moe",
Qwen3-MoE as "qwen3moe" and DeepSeek-V3 as "deepseek2". Experts come stacked ([experts, rows,
columns]); they export as `experts.gate_proj`, `experts.up_proj` and `experts.down_proj` of the
layer's sparse block, which `expert_weights.fill_experts` reads. Newer converters store
DeepSeek's `kv_b_proj` as two per-head tensors, `attn_k_b` (each head's key part transposed)
and `attn_v_b`; `join_kv_b` puts them back together.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from typing import Any

import numpy as np

from adapters.gpu.loading.gguf_names import LAYER_NAMES, QK_NORMS

MOE_GGUF_ARCHITECTURES = frozenset({"qwen2moe", "qwen3moe", "deepseek2"})
# llama.cpp's expert_gating_func values.
_GATING_SOFTMAX, _GATING_SIGMOID = 1, 2
_LAYER = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")

_QWEN3_MOE = QK_NORMS
_QWEN2_MOE = {
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
_DEEPSEEK = {
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
    # What every routed family below reads alike: the experts a token uses and their width.
    experts = {
        "num_experts_per_tok": int(key("expert_used_count")),
        "moe_intermediate_size": int(key("expert_feed_forward_length")),
    }
    # The Qwen families route every layer that has a router (decoder_sparse_step 1).
    qwen_layers = {
        "decoder_sparse_step": 1,
        "mlp_only_layers": [i for i in range(layers) if not routed[i]],
    }
    if architecture == "qwen2moe":
        shared = int(key("expert_shared_feed_forward_length", 0))
        config.update(
            architectures=["Qwen2MoeForCausalLM"],
            model_type="qwen2_moe",
            num_experts=count,
            **experts,
            **qwen_layers,
            shared_expert_intermediate_size=shared,
            # llama.cpp's qwen2moe graph keeps the softmax weights of the chosen experts as
            # they are, as Qwen2-MoE's configs ask; a converter may still say otherwise.
            norm_topk_prob=bool(key("expert_weights_norm", False)),
            qkv_bias="blk.0.attn_q.bias" in tensor_names,
            use_sliding_window=False,
        )
        return
    if architecture == "qwen3moe":
        config.update(
            architectures=["Qwen3MoeForCausalLM"],
            model_type="qwen3_moe",
            num_experts=count,
            **experts,
            **qwen_layers,
            norm_topk_prob=bool(key("expert_weights_norm", True)),
        )
        return
    gating = int(key("expert_gating_func", _GATING_SIGMOID))
    if gating != _GATING_SIGMOID:
        raise ValueError(f"DeepSeek expert gating function {gating} is not supported (sigmoid: 2)")
    rope = int(key("rope.dimension_count"))
    q_rank = int(key("attention.q_lora_rank", 0)) or None
    first_routed = routed.index(True) if any(routed) else layers
    # Converters that split kv_b write the per-head widths under the _mla keys and the cached
    # latent's widths (rank + rope, rank) under the plain ones; older ones only the plain.
    key_length = int(key("attention.key_length_mla", 0)) or int(key("attention.key_length"))
    value_length = int(key("attention.value_length_mla", 0)) or int(key("attention.value_length"))
    config.update(
        architectures=["DeepseekV3ForCausalLM"],
        model_type="deepseek_v3",
        n_routed_experts=count,
        **experts,
        n_shared_experts=int(key("expert_shared_count", 0)),
        first_k_dense_replace=int(key("leading_dense_block_count", first_routed)),
        routed_scaling_factor=float(key("expert_weights_scale", 1.0)),
        norm_topk_prob=bool(key("expert_weights_norm", True)),
        n_group=int(key("expert_group_count", 1)),
        topk_group=int(key("expert_group_used_count", 1)),
        q_lora_rank=q_rank,
        kv_lora_rank=int(key("attention.kv_lora_rank")),
        qk_rope_head_dim=rope,
        qk_nope_head_dim=key_length - rope,
        v_head_dim=value_length,
        head_dim=rope,
        # The latent cache is one shared row per token, whatever head_count_kv says.
        num_key_value_heads=config["num_attention_heads"],
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
    if match is None or model_type not in ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3"):
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
    families = {"qwen2_moe": _QWEN2_MOE, "qwen3_moe": _QWEN3_MOE, "deepseek_v3": _DEEPSEEK}
    # Tensors named as in a llama layer are plain (no Q/K row permutation undone).
    table = {**LAYER_NAMES, **families[model_type]}
    if kind not in table:
        return None
    return f"{prefix}{table[kind]}.{suffix}", None


def moe_tensor_shape(hf_name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The HF shape of a GGUF tensor of `shape`: Qwen2-MoE's shared expert gate is one row
    ([1, hidden]), which a writer may have stored as a vector."""
    if hf_name.endswith("mlp.shared_expert_gate.weight") and len(shape) == 1:
        return (1, *shape)
    return shape


# A split key/value up-projection: the layer's attn_k_b and attn_v_b tensor names.
_K_B = re.compile(r"blk\.(\d+)\.attn_k_b\.weight")


def split_kv_b_layers(tensor_names: Collection[str]) -> dict[str, tuple[str, str]]:
    """Per kv_b_proj HF name, the attn_k_b and attn_v_b GGUF tensors that hold it, for the
    layers that have no attn_kv_b (a file with both keeps attn_kv_b and drops the parts)."""
    joined = {}
    for name in tensor_names:
        match = _K_B.fullmatch(name)
        if match is None or f"blk.{match.group(1)}.attn_kv_b.weight" in tensor_names:
            continue
        layer = match.group(1)
        hf_name = f"model.layers.{layer}.self_attn.kv_b_proj.weight"
        joined[hf_name] = (name, f"blk.{layer}.attn_v_b.weight")
    return joined


def kv_b_shape(config: dict[str, Any]) -> tuple[int, int]:
    """kv_b_proj's [heads * (no-rope + value), kv rank] shape under `config`."""
    heads = config["num_attention_heads"]
    per_head = config["qk_nope_head_dim"] + config["v_head_dim"]
    return heads * per_head, config["kv_lora_rank"]


def join_kv_b(k_b: np.ndarray, v_b: np.ndarray, config: dict[str, Any]) -> np.ndarray:
    """kv_b_proj from llama.cpp's attn_k_b ([heads, kv rank, no-rope]: each head's key rows
    transposed) and attn_v_b ([heads, value, kv rank]): per head, its key rows then its value
    rows, as DeepSeek's checkpoints hold them. ValueError when the sizes do not fit `config`."""
    heads, rank = config["num_attention_heads"], config["kv_lora_rank"]
    nope, value = config["qk_nope_head_dim"], config["v_head_dim"]
    if k_b.size != heads * rank * nope or v_b.size != heads * value * rank:
        raise ValueError(
            f"attn_k_b ({k_b.size} values) and attn_v_b ({v_b.size} values) do not hold "
            f"{heads} heads of rank {rank} with {nope} no-rope and {value} value dimensions"
        )
    keys = k_b.reshape(heads, rank, nope).transpose(0, 2, 1)
    values = v_b.reshape(heads, value, rank)
    return np.ascontiguousarray(np.concatenate((keys, values), axis=1).reshape(-1, rank))
