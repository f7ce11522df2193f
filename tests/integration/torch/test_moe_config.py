"""Mixture-of-experts and latent-attention settings read from transformers' config.json."""

from __future__ import annotations

import math

import pytest

from adapters.gpu.distributed.split import SplitError, split_model
from adapters.gpu.model.config import ModelConfig

BASE = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 320,
    "max_position_embeddings": 256,
}


def test_qwen3_moe_layers_are_sparse_by_step_except_the_mlp_only_ones() -> None:
    config = ModelConfig.from_hf_dict(
        {
            **BASE,
            "architectures": ["Qwen3MoeForCausalLM"],
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "decoder_sparse_step": 2,
            "mlp_only_layers": [3],
        }
    )

    assert config.qk_norm
    assert config.experts is not None
    assert config.experts.sparse_layers == (False, True, False, False)
    assert not config.experts.normalize  # norm_topk_prob defaults to False


def test_mixtral_routes_every_layer_over_its_local_experts_with_its_window() -> None:
    config = ModelConfig.from_hf_dict(
        {
            **BASE,
            "architectures": ["MixtralForCausalLM"],
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": 16,
        }
    )

    assert config.experts is not None
    assert (config.experts.num_experts, config.experts.inner) == (4, 96)
    assert config.experts.sparse_layers == (True,) * 4
    assert config.experts.normalize
    assert config.sliding_windows == (16,) * 4


DEEPSEEK = {
    **BASE,
    "architectures": ["DeepseekV3ForCausalLM"],
    "n_routed_experts": 8,
    "n_shared_experts": 2,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "n_group": 4,
    "topk_group": 2,
    "routed_scaling_factor": 2.5,
    "first_k_dense_replace": 1,
    "q_lora_rank": None,
    "kv_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 12,
    "rope_scaling": {
        "type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
}


def test_deepseek_caches_one_latent_row_and_folds_yarn_mscale_into_the_scale() -> None:
    config = ModelConfig.from_hf_dict(DEEPSEEK)

    latent = config.latent_attention
    assert latent is not None and latent.q_lora_rank is None
    assert (config.num_key_value_heads, config.head_dim, config.cache_width) == (1, 8, 24)
    mscale = 0.1 * math.log(4.0) + 1.0
    assert latent.softmax_scale == pytest.approx(24**-0.5 * mscale * mscale)
    assert config.experts is not None
    assert config.experts.sparse_layers == (False, True, True, True)
    assert config.experts.shared_inner == 64
    assert (config.experts.groups, config.experts.top_groups) == (4, 2)


def test_an_unknown_deepseek_scoring_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="scoring_func 'softmax'"):
        ModelConfig.from_hf_dict({**DEEPSEEK, "scoring_func": "softmax"})


def test_more_ranks_than_columns_per_expert_is_a_split_error() -> None:
    config = ModelConfig.from_hf_dict({**DEEPSEEK, "moe_intermediate_size": 2})

    with pytest.raises(SplitError, match="2 columns per expert cannot cover 4 ranks"):
        split_model(config, 4, 320)
