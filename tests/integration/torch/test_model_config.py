"""ModelConfig reads Hugging Face config.json files of the supported Llama-family models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from adapters.gpu.model.config import ModelConfig

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 1000,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 3,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 2048,
    "bos_token_id": 1,
    "eos_token_id": [2, 7],
}


def write_config(directory: Path, **fields: Any) -> Path:
    merged = {**LLAMA, **fields}
    (directory / "config.json").write_text(
        json.dumps({k: v for k, v in merged.items() if v is not ...})
    )
    return directory


def test_llama_config_reads_shapes_token_ids_and_derived_head_dim(tmp_path: Path) -> None:
    config = ModelConfig.from_dir(write_config(tmp_path, rope_theta=500_000.0))

    assert (config.vocab_size, config.hidden_size, config.intermediate_size) == (1000, 256, 512)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (8, 2, 32)
    assert config.num_query_groups == 4
    assert config.rope_theta == 500_000.0 and config.rope_scaling is None
    assert config.eos_token_ids == (2, 7) and config.bos_token_id == 1
    assert not config.tie_word_embeddings and not config.attention_bias
    assert config.sliding_windows == (None, None, None)


def test_explicit_head_dim_wins_over_hidden_size_over_heads(tmp_path: Path) -> None:
    config = ModelConfig.from_dir(write_config(tmp_path, head_dim=64))

    assert config.head_dim == 64


def test_legacy_rope_scaling_spelling_is_read_like_rope_parameters(tmp_path: Path) -> None:
    legacy_dir, modern_dir = tmp_path / "legacy", tmp_path / "modern"
    legacy_dir.mkdir()
    modern_dir.mkdir()
    write_config(legacy_dir, rope_theta=1e6, rope_scaling={"type": "linear", "factor": 4.0})
    write_config(
        modern_dir,
        rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
    )

    legacy, modern = ModelConfig.from_dir(legacy_dir), ModelConfig.from_dir(modern_dir)

    assert legacy == modern
    assert legacy.rope_theta == 1e6
    assert legacy.rope_scaling == {"rope_type": "linear", "factor": 4.0}


def test_llama3_scaling_defaults_its_original_context_to_max_positions(tmp_path: Path) -> None:
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1, "high_freq_factor": 4}

    config = ModelConfig.from_dir(write_config(tmp_path, rope_scaling=scaling))

    assert config.rope_scaling is not None
    assert config.rope_scaling["original_max_position_embeddings"] == 2048


@pytest.mark.model
def test_qwen2_has_qkv_bias_but_no_output_bias_and_windows_on_late_layers(tmp_path: Path) -> None:
    config = ModelConfig.from_dir(
        write_config(
            tmp_path,
            architectures=["Qwen2ForCausalLM"],
            model_type="qwen2",
            use_sliding_window=True,
            sliding_window=128,
            max_window_layers=2,
            layer_types=...,
        )
    )

    assert config.attention_bias and not config.output_bias
    assert config.sliding_windows == (None, None, 128)


@pytest.mark.model
def test_qwen2_window_is_ignored_unless_use_sliding_window_is_set(tmp_path: Path) -> None:
    config = ModelConfig.from_dir(
        write_config(tmp_path, architectures=["Qwen2ForCausalLM"], sliding_window=128)
    )

    assert config.sliding_windows == (None, None, None)


@pytest.mark.model
def test_mistral_window_applies_to_every_layer(tmp_path: Path) -> None:
    config = ModelConfig.from_dir(
        write_config(tmp_path, architectures=["MistralForCausalLM"], sliding_window=4096)
    )

    assert config.sliding_windows == (4096, 4096, 4096)


def test_unsupported_architecture_is_rejected_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        ModelConfig.from_dir(write_config(tmp_path, architectures=["GPT2LMHeadModel"]))


def test_unsupported_rope_type_is_rejected(tmp_path: Path) -> None:
    scaling = {"rope_type": "proportional", "factor": 2.0}

    with pytest.raises(ValueError, match="proportional"):
        ModelConfig.from_dir(write_config(tmp_path, rope_scaling=scaling))


def test_heads_that_do_not_divide_into_kv_heads_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="multiple"):
        ModelConfig.from_dir(write_config(tmp_path, num_key_value_heads=3))


def test_missing_config_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="config.json"):
        ModelConfig.from_dir(tmp_path)
