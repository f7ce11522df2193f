"""Tiny Qwen2-MoE, Qwen3-MoE, Mixtral and DeepSeek-V3 written as llama.cpp lays out their GGUF
files (DeepSeek also as newer converters split its kv_b_proj) load through our GGUF export to the
logits transformers computes from the original checkpoint."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file

from adapters.gpu.loading.gguf_export import export_gguf, gguf_layout, open_gguf
from adapters.gpu.loading.weights import load_model
from adapters.gpu.model.forward_batch import ForwardBatch, SequenceChunk
from adapters.gpu.model.kv_cache import PagedKVCache
from tests.support.tiny_moe_serving import MOE_VOCAB, build_tiny_moe_model_dir

ATOL = 1e-4
BLOCK_SIZE = 4
GGUF_ARCHITECTURE = {
    "mixtral": "llama",
    "qwen2_moe": "qwen2moe",
    "qwen3_moe": "qwen3moe",
    "deepseek_v3": "deepseek2",
}
# llama.cpp's token types.
NORMAL, CONTROL = 1, 3


def _permuted(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter order for llama Q/K rows: each head's rotary halves interleaved."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def _split_kv_b(kv_b: np.ndarray, config: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Newer llama.cpp converters' attn_k_b (each head's key rows transposed: [heads, rank,
    no-rope]) and attn_v_b ([heads, value, rank]) from DeepSeek's kv_b_proj."""
    heads, nope = config["num_attention_heads"], config["qk_nope_head_dim"]
    per_head = kv_b.reshape(heads, nope + config["v_head_dim"], config["kv_lora_rank"])
    return per_head[:, :nope].transpose(0, 2, 1), per_head[:, nope:]


def _layer_tensors(
    config: dict[str, Any], state: dict[str, np.ndarray], layer: int, split_kv_b: bool = False
) -> dict[str, np.ndarray]:
    """One layer's GGUF tensors from its HF tensors, in llama.cpp's names."""
    model_type = config["model_type"]
    hf = f"model.layers.{layer}."
    out = {
        "attn_norm.weight": state[hf + "input_layernorm.weight"],
        "ffn_norm.weight": state[hf + "post_attention_layernorm.weight"],
        "attn_output.weight": state[hf + "self_attn.o_proj.weight"],
    }
    attention = {
        "q_a_proj": "attn_q_a",
        "q_a_layernorm": "attn_q_a_norm",
        "q_b_proj": "attn_q_b",
        "kv_a_proj_with_mqa": "attn_kv_a_mqa",
        "kv_a_layernorm": "attn_kv_a_norm",
        "kv_b_proj": "attn_kv_b",
        "q_proj": "attn_q",
        "k_proj": "attn_k",
        "v_proj": "attn_v",
        "q_norm": "attn_q_norm",
        "k_norm": "attn_k_norm",
    }
    for name, gguf in attention.items():
        for suffix in ("weight", "bias"):
            key = f"{hf}self_attn.{name}.{suffix}"
            if key in state:
                out[f"{gguf}.{suffix}"] = state[key]
    if split_kv_b:
        out["attn_k_b.weight"], out["attn_v_b.weight"] = _split_kv_b(
            out.pop("attn_kv_b.weight"), config
        )
    if model_type == "mixtral":
        heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
        out["attn_q.weight"] = _permuted(out["attn_q.weight"], heads)
        out["attn_k.weight"] = _permuted(out["attn_k.weight"], kv_heads)
    block = hf + ("block_sparse_moe." if model_type == "mixtral" else "mlp.")
    if block + "gate.weight" not in state:
        for part in ("gate", "up", "down"):
            out[f"ffn_{part}.weight"] = state[f"{hf}mlp.{part}_proj.weight"]
        return out
    out["ffn_gate_inp.weight"] = state[block + "gate.weight"]
    names = ("w1", "w3", "w2") if model_type == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    count = state[block + "gate.weight"].shape[0]
    for part, name in zip(("gate", "up", "down"), names, strict=True):
        experts = [state[f"{block}experts.{e}.{name}.weight"] for e in range(count)]
        out[f"ffn_{part}_exps.weight"] = np.stack(experts)
    if block + "gate.e_score_correction_bias" in state:
        out["exp_probs_b.bias"] = state[block + "gate.e_score_correction_bias"]
    for part in ("gate", "up", "down"):
        for shared in ("shared_experts", "shared_expert"):
            key = f"{block}{shared}.{part}_proj.weight"
            if key in state:
                out[f"ffn_{part}_shexp.weight"] = state[key]
    if block + "shared_expert_gate.weight" in state:
        out["ffn_gate_inp_shexp.weight"] = state[block + "shared_expert_gate.weight"]
    return out


def _metadata(writer: Any, arch: str, config: dict[str, Any], split_kv_b: bool = False) -> None:
    add = {int: writer.add_uint32, float: writer.add_float32, bool: writer.add_bool}
    values: dict[str, Any] = {
        "context_length": config["max_position_embeddings"],
        "embedding_length": config["hidden_size"],
        "block_count": config["num_hidden_layers"],
        "feed_forward_length": config["intermediate_size"],
        "attention.head_count": config["num_attention_heads"],
        "attention.head_count_kv": config["num_key_value_heads"],
        "attention.layer_norm_rms_epsilon": float(config["rms_norm_eps"]),
        "rope.freq_base": float(config["rope_parameters"]["rope_theta"]),
        "vocab_size": config["vocab_size"],
        "expert_used_count": config["num_experts_per_tok"],
    }
    model_type = config["model_type"]
    if model_type == "mixtral":
        values["expert_count"] = config["num_local_experts"]
    if model_type == "qwen2_moe":
        # llama.cpp's converter writes no expert_weights_norm for qwen2moe.
        values["expert_count"] = config["num_experts"]
        values["expert_feed_forward_length"] = config["moe_intermediate_size"]
        values["expert_shared_feed_forward_length"] = config["shared_expert_intermediate_size"]
    if model_type == "qwen3_moe":
        values["expert_count"] = config["num_local_experts"]
        values["expert_feed_forward_length"] = config["moe_intermediate_size"]
        values["attention.key_length"] = config["hidden_size"] // config["num_attention_heads"]
        values["expert_weights_norm"] = bool(config["norm_topk_prob"])
    if model_type == "deepseek_v3":
        rope = config["rope_parameters"]
        values.update(
            {
                "expert_count": config["n_routed_experts"],
                "expert_feed_forward_length": config["moe_intermediate_size"],
                "expert_shared_count": config["n_shared_experts"],
                "leading_dense_block_count": config["first_k_dense_replace"],
                "expert_weights_scale": float(config["routed_scaling_factor"]),
                "expert_weights_norm": bool(config["norm_topk_prob"]),
                "expert_gating_func": 2,
                "expert_group_count": config["n_group"],
                "expert_group_used_count": config["topk_group"],
                "attention.q_lora_rank": config["q_lora_rank"],
                "attention.kv_lora_rank": config["kv_lora_rank"],
                "attention.key_length": config["qk_nope_head_dim"] + config["qk_rope_head_dim"],
                "attention.value_length": config["v_head_dim"],
                "rope.dimension_count": config["qk_rope_head_dim"],
                "rope.scaling.factor": float(rope["factor"]),
                "rope.scaling.original_context_length": rope["original_max_position_embeddings"],
                "rope.scaling.yarn_log_multiplier": 0.1 * float(rope["mscale_all_dim"]),
            }
        )
        writer.add_string(f"{arch}.rope.scaling.type", "yarn")
        if split_kv_b:
            # Newer converters: the cached latent's widths under the plain keys, one KV head.
            rank = config["kv_lora_rank"]
            values["attention.key_length_mla"] = values["attention.key_length"]
            values["attention.value_length_mla"] = values["attention.value_length"]
            values["attention.key_length"] = rank + config["qk_rope_head_dim"]
            values["attention.value_length"] = rank
            values["attention.head_count_kv"] = 1
    for name, value in values.items():
        add[type(value)](f"{arch}.{name}", value)


def _tokenizer(writer: Any, directory: Path, config: dict[str, Any]) -> None:
    tokenizer = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = tokenizer["model"]["vocab"]
    specials = {token["content"] for token in tokenizer["added_tokens"] if token["special"]}
    tokens = sorted(vocab, key=vocab.__getitem__)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([CONTROL if token in specials else NORMAL for token in tokens])
    writer.add_token_merges([" ".join(pair) for pair in tokenizer["model"]["merges"]])
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])


def write_gguf(directory: Path, path: Path, *, split_kv_b: bool = False) -> Path:
    """`directory`'s float32 checkpoint as llama.cpp's converter would write it (F32);
    `split_kv_b` writes DeepSeek's kv_b_proj as attn_k_b and attn_v_b, as newer ones do."""
    import gguf

    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    state = {name: t.numpy() for name, t in load_file(directory / "model.safetensors").items()}
    arch = GGUF_ARCHITECTURE[config["model_type"]]
    writer = gguf.GGUFWriter(path, arch)
    _metadata(writer, arch, config, split_kv_b)
    _tokenizer(writer, directory, config)
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    writer.add_tensor("output.weight", state["lm_head.weight"])
    for layer in range(config["num_hidden_layers"]):
        for name, tensor in _layer_tensors(config, state, layer, split_kv_b).items():
            writer.add_tensor(f"blk.{layer}.{name}", np.ascontiguousarray(tensor))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# Family, and whether DeepSeek's kv_b_proj is written split (attn_k_b, attn_v_b).
CASES = [
    ("qwen2-moe", False),
    ("qwen3-moe", False),
    ("mixtral", False),
    ("deepseek-v3", False),
    ("deepseek-v3", True),
]


@pytest.mark.model
@pytest.mark.parametrize(("family", "split_kv_b"), CASES)
def test_a_llama_cpp_layout_gguf_loads_to_the_checkpoint_s_logits(
    family: str, split_kv_b: bool, tmp_path: Path
) -> None:
    directory = build_tiny_moe_model_dir(tmp_path / "hf", family)
    path = write_gguf(directory, tmp_path / "tiny.gguf", split_kv_b=split_kv_b)
    if family == "deepseek-v3":
        names = {tensor.name for tensor in open_gguf(path).tensors}
        assert ("blk.1.attn_k_b.weight" in names) == split_kv_b
        assert ("blk.1.attn_kv_b.weight" in names) != split_kv_b
    exported = export_gguf(path, tmp_path / "export")
    written = load_file(exported / "model.safetensors")
    # The start-up check sees the shapes the export writes.
    assert gguf_layout(path).shapes == {name: tuple(t.shape) for name, t in written.items()}
    if family == "deepseek-v3":
        # The tiny model's attention scores are small, so its logits barely notice a wrong
        # key layout: the joined kv_b_proj must be the checkpoint's, bit for bit.
        original = load_file(directory / "model.safetensors")
        for layer in range(2):
            name = f"model.layers.{layer}.self_attn.kv_b_proj.weight"
            assert torch.equal(written[name], original[name])
    reference = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    tokens = [random.Random(1).randrange(MOE_VOCAB) for _ in range(30)]
    with torch.no_grad():
        expected = reference.eval()(torch.tensor([tokens])).logits[0]

    model = load_model(exported, dtype=torch.float32, device="cpu")
    cache = PagedKVCache.allocate(model.config, 8, BLOCK_SIZE, torch.float32, "cpu")
    batch = ForwardBatch.build(
        [SequenceChunk(tuple(tokens), 0, tuple(range(8)))], BLOCK_SIZE, "cpu"
    )
    logits = model.compute_logits(model(batch, cache))

    assert model.config.architecture == reference.config.architectures[0]
    assert (logits - expected).abs().max().item() <= ATOL
