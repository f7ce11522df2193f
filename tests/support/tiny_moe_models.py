"""Builders of tiny random mixture-of-experts checkpoints (Qwen2/3-MoE, Mixtral, DeepSeek-V3)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.support.tiny_models import DEFAULT_INIT_STD, make_decisive

_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 512,
    "bos_token_id": 1,
    "eos_token_id": 2,
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


def build_tiny_qwen3_moe(
    directory: Path | str,
    *,
    vocab_size: int = 384,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    decisive: bool = False,
    **overrides: Any,
) -> Path:
    """A random `Qwen3MoeForCausalLM`: 8 experts, top-2 with renormalised weights, per-head
    q/k norms, layer 0 dense (`mlp_only_layers`) and layer 1 sparse."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    settings = {
        **_SHAPE,
        "num_key_value_heads": 2,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
        "mlp_only_layers": [0],
        **overrides,
    }
    config = Qwen3MoeConfig(vocab_size=vocab_size, **settings)
    return _save(Qwen3MoeForCausalLM, config, directory, seed, dtype, decisive)


def build_tiny_qwen2_moe(
    directory: Path | str,
    *,
    vocab_size: int = 384,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    decisive: bool = False,
    **overrides: Any,
) -> Path:
    """A random `Qwen2MoeForCausalLM`: q/k/v biases, 8 experts top-2 (weights not
    renormalised) and a shared expert of width 48 behind a sigmoid gate in both layers."""
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    settings = {
        **_SHAPE,
        "num_key_value_heads": 2,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48,
        **overrides,
    }
    config = Qwen2MoeConfig(vocab_size=vocab_size, **settings)
    return _save(Qwen2MoeForCausalLM, config, directory, seed, dtype, decisive)


def build_tiny_mixtral(
    directory: Path | str,
    *,
    vocab_size: int = 384,
    seed: int = 0,
    sliding_window: int | None = None,
    dtype: torch.dtype = torch.float32,
    decisive: bool = False,
    **overrides: Any,
) -> Path:
    """A random `MixtralForCausalLM`: 4 experts of width 96, top-2, optional sliding window."""
    from transformers import MixtralConfig, MixtralForCausalLM

    settings = {
        **_SHAPE,
        "num_key_value_heads": 2,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": sliding_window,
        **overrides,
    }
    config = MixtralConfig(vocab_size=vocab_size, **settings)
    return _save(MixtralForCausalLM, config, directory, seed, dtype, decisive)


def build_tiny_deepseek_v3(
    directory: Path | str,
    *,
    vocab_size: int = 384,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    decisive: bool = False,
    **overrides: Any,
) -> Path:
    """A random `DeepseekV3ForCausalLM`: latent attention (q rank 32, kv rank 16, rotary 8,
    no-rope 16, value 12) with interleaved yarn rope, layer 0 dense, layer 1 routed over 8
    experts in 4 groups (2 groups kept, top-2, sigmoid scores with a correction bias, scaling
    2.5) plus one shared expert."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

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
        **overrides,
    }
    config = DeepseekV3Config(vocab_size=vocab_size, **settings)
    return _save(DeepseekV3ForCausalLM, config, directory, seed, dtype, decisive)


def _save(
    model_class: Any,
    config: Any,
    directory: Path | str,
    seed: int,
    dtype: torch.dtype,
    decisive: bool,
) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config).to(torch.float32).eval()
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
                if not tensor.is_floating_point() or "rotary" in name:
                    continue
                noise = torch.randn(tensor.shape, generator=generator)
                if "norm" in name:
                    tensor.copy_(1.0 + 0.1 * noise)
                elif "bias" in name:
                    tensor.copy_(0.1 * noise)
                else:
                    tensor.copy_(DEFAULT_INIT_STD * noise)
            if decisive:
                make_decisive(model, generator)
    model.to(dtype).save_pretrained(directory)
    return directory
