"""Writes a tiny HF checkpoint as a float32 GGUF file the way llama.cpp's converter does."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

# What convert_hf_to_gguf.py writes for each architecture beyond the common keys.
_ARCHITECTURES = ("qwen3", "phi3", "gemma3")
_TOKEN_TYPE_NORMAL = 1
_TOKEN_TYPE_CONTROL = 3


def write_gguf(model_dir: Path, path: Path, architecture: str) -> Path:
    """`model_dir`'s config, float32 weights and byte-level BPE tokenizer as one GGUF file:
    tensor names from gguf's own HF mapping, Gemma norms stored as 1 + w, Phi-3's fused
    projections kept fused and its longrope factors as rope_factors_* tensors."""
    import gguf
    from safetensors.numpy import load_file

    if architecture not in _ARCHITECTURES:
        raise ValueError(f"no GGUF writer for {architecture!r}")
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    weights = load_file(model_dir / "model.safetensors")
    layers = config["num_hidden_layers"]
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, architecture.upper()), layers)
    writer = gguf.GGUFWriter(str(path), architecture)
    _common_keys(writer, config)
    extra: dict[str, np.ndarray] = {}
    if architecture == "phi3":
        extra = _phi3_keys(writer, config)
    elif architecture == "gemma3":
        writer.add_sliding_window(config["sliding_window"])
        if config.get("final_logit_softcapping"):
            writer.add_final_logit_softcapping(config["final_logit_softcapping"])
    _tokenizer_keys(writer, model_dir)
    for hf_name, values in weights.items():
        stem = hf_name.removesuffix(".weight")
        gguf_name = names.get_name(stem)
        if gguf_name is None:
            raise ValueError(f"gguf maps no name for {hf_name}")
        data = np.ascontiguousarray(values, dtype=np.float32)
        if architecture == "gemma3" and hf_name.endswith("norm.weight"):
            data = data + np.float32(1.0)
        writer.add_tensor(f"{gguf_name}.weight", data)
    for name, data in extra.items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _common_keys(writer: Any, config: dict[str, Any]) -> None:
    rope = config.get("rope_parameters") or {}
    theta = rope.get("full_attention", rope).get("rope_theta", config.get("rope_theta"))
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if config.get("head_dim"):
        writer.add_key_length(config["head_dim"])
        writer.add_value_length(config["head_dim"])
    writer.add_rope_freq_base(theta)
    writer.add_file_type(0)  # all float32


def _phi3_keys(writer: Any, config: dict[str, Any]) -> dict[str, np.ndarray]:
    rope = config["rope_parameters"]
    original = config["original_max_position_embeddings"]
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    writer.add_rope_scaling_orig_ctx_len(original)
    writer.add_rope_dimension_count(int(rope.get("partial_rotary_factor", 1.0) * head_dim))
    writer.add_sliding_window(config.get("sliding_window") or 0)
    if rope.get("rope_type") != "longrope":
        return {}
    scale = config["max_position_embeddings"] / original
    attn_factor = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0
    writer.add_rope_scaling_attn_factors(attn_factor)
    return {
        "rope_factors_long.weight": np.asarray(rope["long_factor"], dtype=np.float32),
        "rope_factors_short.weight": np.asarray(rope["short_factor"], dtype=np.float32),
    }


def _tokenizer_keys(writer: Any, model_dir: Path) -> None:
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    vocab: dict[str, int] = tokenizer["model"]["vocab"]
    tokens = [""] * len(vocab)
    for piece, token_id in vocab.items():
        tokens[token_id] = piece
    specials = {added["id"] for added in tokenizer["added_tokens"] if added["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(
        [_TOKEN_TYPE_CONTROL if i in specials else _TOKEN_TYPE_NORMAL for i in range(len(tokens))]
    )
    writer.add_token_merges(merges)
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    for role in ("bos", "eos"):
        token_id = config.get(f"{role}_token_id")
        if isinstance(token_id, int):
            getattr(writer, f"add_{role}_token_id")(token_id)
