"""Export a GGUF file (llama, qwen3, phi3, gemma3, MoE families) as a float32 HF directory."""

from __future__ import annotations

import functools
import json
import math
import os
import re
import shutil
import struct
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from adapters.gpu.loading import gguf_tokenizer
from adapters.gpu.loading.gguf_metadata import MISSING
from adapters.gpu.loading.gguf_metadata import field as _field
from adapters.gpu.loading.gguf_moe import (
    MOE_GGUF_ARCHITECTURES,
    join_kv_b,
    kv_b_shape,
    moe_config,
    moe_tensor_name,
    moe_tensor_shape,
    split_kv_b_layers,
)
from adapters.gpu.loading.gguf_names import LAYER_NAMES, QK_NORMS

_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.weight")
# Per architecture, the layer tensors whose llama.cpp names mean something else than above.
_ARCHITECTURE_LAYER_NAMES: dict[str, dict[str, str]] = {
    "llama": {},
    "qwen3": QK_NORMS,
    # Phi-3 keeps its fused projections; llama.cpp stores gate_up_proj as ffn_up.
    "phi3": {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
    "gemma3": {
        "attn_q_norm": "self_attn.q_norm",
        "attn_k_norm": "self_attn.k_norm",
        "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    },
}
# The HF architecture, model_type and tensor layout of each GGUF architecture.
_ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "phi3": ("Phi3ForCausalLM", "phi3"),
    "gemma3": ("Gemma3ForCausalLM", "gemma3_text"),
}
# Only llama's converter interleaves Q/K rows for its rope kernel; the others use NeoX order.
_INTERLEAVED_ROPE = frozenset({"llama"})
# llama.cpp's convert script stores every Gemma norm weight as 1 + w (Gemma3RMSNorm's scale).
_NORM_SHIFTED = frozenset({"gemma3"})
# llama.cpp's Gemma 3 constants where the GGUF has no key: one global layer in six, and the
# local layers' rope base.
_GEMMA3_SLIDING_PATTERN = 6
_GEMMA3_LOCAL_THETA = 10_000.0
_GEMMA3_27B_BLOCKS = 62
_GLOBAL_TENSOR_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# Phi-3's longrope factors travel as tensors; they become config.json lists.
_ROPE_FACTOR_TENSORS = {"rope_factors_short.weight": "short", "rope_factors_long.weight": "long"}
# DeepSeek's split key/value up-projection; its halves export joined as kv_b_proj.
_SPLIT_KV_B = re.compile(r"blk\.\d+\.attn_[kv]_b\.weight")


@dataclass(frozen=True)
class _Plan:
    """One GGUF tensor and where its float32 rows go in model.safetensors."""

    gguf_name: str
    hf_name: str
    shape: tuple[int, ...]
    unpermute_heads: int | None
    # Subtracted from every value: Gemma's norms are stored as 1 + w.
    shift: float = 0.0
    # Further GGUF tensors that `join` combines with the first into the HF tensor.
    parts: tuple[str, ...] = ()
    join: Callable[..., np.ndarray] | None = None


def export_gguf(gguf_path: Path, out_dir: Path, *, progress: bool = True) -> Path:
    """Write config, float32 weights and tokenizer files of `gguf_path` into `out_dir`.

    The directory appears whole or not at all: everything is written into a staging
    directory beside `out_dir` that is renamed at the end. Raises FileExistsError when
    `out_dir` exists (also when a concurrent export renamed its copy first) and ValueError
    for a GGUF this exporter cannot represent faithfully.
    """
    gguf_path = Path(gguf_path)
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise FileExistsError(f"export target already exists: {out_dir}")
    reader = open_gguf(gguf_path)
    config = _model_config(reader, gguf_path)
    tokenizer_json = gguf_tokenizer.tokenizer_json(reader, gguf_path)
    tokenizer_config = gguf_tokenizer.tokenizer_config(reader, config["max_position_embeddings"])
    plans = _tensor_plans(reader, config, gguf_path)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        _write_json(staging / "config.json", config)
        _write_json(staging / "generation_config.json", _generation_config(reader))
        _write_json(staging / "tokenizer_config.json", tokenizer_config)
        (staging / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
        _write_safetensors(staging / "model.safetensors", reader, plans, progress=progress)
        # mkdtemp makes the directory private; an exported model is ordinary readable data.
        os.chmod(staging, 0o755)
        try:
            os.rename(staging, out_dir)
        except OSError as error:
            if out_dir.exists():
                raise FileExistsError(f"export target appeared meanwhile: {out_dir}") from error
            raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir


@dataclass(frozen=True)
class GgufLayout:
    """What a GGUF file exports to, read from its metadata and tensor infos alone: the HF
    `config.json` it becomes and the HF name and shape of every tensor."""

    config: dict[str, Any]
    shapes: dict[str, tuple[int, ...]]


def gguf_layout(gguf_path: Path) -> GgufLayout:
    """The export of `gguf_path` without dequantizing anything: the same checks and renaming
    `export_gguf` applies (architecture, tensor types, tensor names, the tokenizer built from
    the metadata), so that a file this accepts is one the export accepts. Raises ValueError
    naming the file."""
    gguf_path = Path(gguf_path)
    reader = open_gguf(gguf_path)
    config = _model_config(reader, gguf_path)
    gguf_tokenizer.tokenizer_json(reader, gguf_path)
    plans = _tensor_plans(reader, config, gguf_path)
    return GgufLayout(config, {plan.hf_name: plan.shape for plan in plans})


def open_gguf(gguf_path: Path) -> Any:
    """A `gguf.GGUFReader` of `gguf_path` whose tensors all have a type the export can turn
    into float32; ValueError naming the file (and the tensor, for a bad type) otherwise."""
    import gguf

    try:
        reader = _reader_class()(gguf_path)
    except _UnknownTensorType as error:
        raise ValueError(
            f"{gguf_path}: tensor {error.tensor!r} has GGUF type {error.type_id}, which is not "
            "a quantization type this gguf library knows"
        ) from None
    except (ValueError, OSError, IndexError, UnicodeDecodeError) as error:
        raise ValueError(f"{gguf_path} is not a readable GGUF file: {error}") from None
    from gguf.quants import _type_traits

    readable = {gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, *_type_traits}
    for tensor in reader.tensors:
        if tensor.tensor_type not in readable:
            raise ValueError(
                f"{gguf_path}: tensor {tensor.name!r} has quantization type "
                f"{tensor.tensor_type.name}, which the export cannot dequantize (supported: "
                + ", ".join(sorted(kind.name for kind in readable))
                + ")"
            )
    return reader


class _UnknownTensorType(Exception):
    def __init__(self, tensor: str, type_id: int) -> None:
        super().__init__(tensor, type_id)
        self.tensor = tensor
        self.type_id = type_id


@functools.cache
def _reader_class() -> Any:
    # gguf is imported where it is used, as elsewhere in this module.
    import gguf

    class TypeCheckingReader(gguf.GGUFReader):
        """Names the tensor whose type id is unknown, where the stock reader only says
        that the id is not a GGMLQuantizationType."""

        def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
            known = {int(kind) for kind in gguf.GGMLQuantizationType}
            for field in fields:
                name_data, raw_type = field.parts[1], field.parts[4]
                if int(raw_type[0]) not in known:
                    name = bytes(name_data).decode("utf-8", errors="replace")
                    raise _UnknownTensorType(name, int(raw_type[0]))
            super()._build_tensors(start_offs, fields)

    return TypeCheckingReader


def _float32_value(value: float) -> float:
    # GGUF stores these as float32; the shortest float32 spelling turns 9.9999997e-06 into 1e-05.
    return float(str(np.float32(value)))


def _model_config(reader: Any, gguf_path: Path) -> dict[str, Any]:
    architecture = _field(reader, "general.architecture")
    if architecture not in _ARCHITECTURES and architecture not in MOE_GGUF_ARCHITECTURES:
        supported = sorted({*_ARCHITECTURES, *MOE_GGUF_ARCHITECTURES})
        raise ValueError(
            f"{gguf_path.name}: architecture {architecture!r} is not supported "
            f"(supported: {', '.join(supported)})"
        )

    def key(name: str, default: Any = MISSING) -> Any:
        return _field(reader, f"{architecture}.{name}", default)

    scaling = key("rope.scaling.type", "none")
    # DeepSeek's yarn is read by gguf_moe.moe_config.
    if scaling not in ("none", "", "linear") and architecture != "deepseek2":
        raise ValueError(f"{gguf_path.name}: rope scaling {scaling!r} is not supported")

    tokens = _field(reader, "tokenizer.ggml.tokens")
    hidden_size = int(key("embedding_length"))
    heads = int(key("attention.head_count"))
    kv_heads = int(key("attention.head_count_kv", heads))
    head_dim = int(key("attention.key_length", hidden_size // heads))
    rope_theta = _float32_value(key("rope.freq_base", 10000.0))
    tensor_names = {tensor.name for tensor in reader.tensors}
    # A mixture-of-experts architecture starts as llama; moe_config below names its family.
    hf_architecture, model_type = _ARCHITECTURES.get(architecture, _ARCHITECTURES["llama"])
    config: dict[str, Any] = {
        "architectures": [hf_architecture],
        "model_type": model_type,
        "hidden_act": "silu",
        "hidden_size": hidden_size,
        "intermediate_size": int(key("feed_forward_length")),
        "num_hidden_layers": int(key("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "max_position_embeddings": int(key("context_length")),
        "rms_norm_eps": _float32_value(key("attention.layer_norm_rms_epsilon")),
        "rope_theta": rope_theta,
        # Newer transformers read rope settings from here; older ones read rope_theta above.
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
        "vocab_size": int(key("vocab_size", len(tokens))),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
    }
    if scaling == "linear":
        linear = {"rope_type": "linear", "factor": _float32_value(key("rope.scaling.factor"))}
        config["rope_parameters"] = {**linear, "rope_theta": rope_theta}
    rotary_dims = int(key("rope.dimension_count", head_dim))
    # DeepSeek rotates only its rope part of each head, by design (latent attention).
    if rotary_dims != head_dim and architecture != "deepseek2":
        raise ValueError(
            f"{gguf_path.name}: partial rotary embeddings ({rotary_dims} of {head_dim} "
            "dimensions) are not supported"
        )
    if architecture == "phi3":
        _phi3_settings(reader, config, key, gguf_path)
    elif architecture == "gemma3":
        _gemma3_settings(config, key, scaling)
    for name in ("bos", "eos", "padding"):
        token_id = _field(reader, f"tokenizer.ggml.{name}_token_id", None)
        if token_id is not None:
            config["pad_token_id" if name == "padding" else f"{name}_token_id"] = int(token_id)
    try:
        moe_config(architecture, key, tensor_names, config)
    except ValueError as error:
        raise ValueError(f"{gguf_path.name}: {error}") from error
    return config


def _phi3_settings(reader: Any, config: dict[str, Any], key: Any, gguf_path: Path) -> None:
    """Phi-3's sliding window (0: none) and its longrope factors, which llama.cpp stores as
    the tensors rope_factors_short/long beside the original context length."""
    window = int(key("attention.sliding_window", 0))
    config["sliding_window"] = window or None
    factors = {
        kind: _dequantize(tensor, (int(tensor.shape.prod()),)).astype(np.float64).tolist()
        for tensor in reader.tensors
        if (kind := _ROPE_FACTOR_TENSORS.get(tensor.name)) is not None
    }
    if not factors:
        return
    if set(factors) != {"short", "long"}:
        raise ValueError(f"{gguf_path.name}: longrope needs both rope_factors_short and _long")
    original = int(key("rope.scaling.original_context_length"))
    longrope: dict[str, Any] = {
        "rope_type": "longrope",
        "rope_theta": config["rope_theta"],
        "short_factor": [_float32_value(value) for value in factors["short"]],
        "long_factor": [_float32_value(value) for value in factors["long"]],
        "original_max_position_embeddings": original,
    }
    stored = key("rope.scaling.attn_factor", None)
    scale = config["max_position_embeddings"] / original
    default = 1.0 if scale <= 1 else math.sqrt(1 + math.log(scale) / math.log(original))
    # The converter writes transformers' default; keep only a factor that differs from it.
    if stored is not None and np.float32(stored) != np.float32(default):
        longrope["attention_factor"] = _float32_value(stored)
    config["original_max_position_embeddings"] = original
    config["rope_parameters"] = longrope


def _gemma3_settings(config: dict[str, Any], key: Any, scaling: str) -> None:
    """Gemma 3's GeLU, sliding-window layout, local rope base, query scale and soft-cap, with
    llama.cpp's constants where the GGUF carries no key."""
    layers = config["num_hidden_layers"]
    config["hidden_activation"] = "gelu_pytorch_tanh"
    del config["hidden_act"]
    config["sliding_window"] = int(key("attention.sliding_window"))
    pattern = key("attention.sliding_window_pattern", _GEMMA3_SLIDING_PATTERN)
    if isinstance(pattern, list):
        kinds = ["sliding_attention" if sliding else "full_attention" for sliding in pattern]
    else:
        kinds = [
            "sliding_attention" if (i + 1) % int(pattern) else "full_attention"
            for i in range(layers)
        ]
    config["layer_types"] = kinds
    # llama.cpp scales queries by 1/sqrt(head_dim), except for the 27B model's hidden/heads.
    scalar = config["head_dim"]
    if layers == _GEMMA3_27B_BLOCKS:
        scalar = config["hidden_size"] // config["num_attention_heads"]
    config["query_pre_attn_scalar"] = scalar
    cap = key("final_logit_softcapping", None)
    config["final_logit_softcapping"] = None if cap is None else _float32_value(cap)
    local_theta = _float32_value(key("rope.freq_base_swa", _GEMMA3_LOCAL_THETA))
    full = dict(config.pop("rope_parameters"))
    if scaling != "linear":
        full = {"rope_type": "default", "rope_theta": config["rope_theta"]}
    config["rope_parameters"] = {
        "full_attention": full,
        "sliding_attention": {"rope_type": "default", "rope_theta": local_theta},
    }
    config["rope_local_base_freq"] = local_theta


def _generation_config(reader: Any) -> dict[str, Any]:
    generation: dict[str, Any] = {}
    bos = _field(reader, "tokenizer.ggml.bos_token_id", None)
    if bos is not None:
        generation["bos_token_id"] = int(bos)
    stops = [
        int(token_id)
        for token_id in (
            _field(reader, "tokenizer.ggml.eos_token_id", None),
            _field(reader, "tokenizer.ggml.eot_token_id", None),
        )
        if token_id is not None
    ]
    stops = list(dict.fromkeys(stops))
    if stops:
        generation["eos_token_id"] = stops[0] if len(stops) == 1 else stops
    pad = _field(reader, "tokenizer.ggml.padding_token_id", None)
    if pad is not None:
        generation["pad_token_id"] = int(pad)
    return generation


def _tensor_plans(reader: Any, config: dict[str, Any], gguf_path: Path) -> list[_Plan]:
    architecture = _field(reader, "general.architecture")
    shift = 1.0 if architecture in _NORM_SHIFTED else 0.0
    latent = config.get("model_type") == "deepseek_v3"
    plans = []
    for tensor in reader.tensors:
        if tensor.name in _ROPE_FACTOR_TENSORS:
            continue
        if latent and _SPLIT_KV_B.fullmatch(tensor.name):
            continue  # joined below, or left out beside a whole attn_kv_b
        # GGUF lists dimensions fastest-first; row-major HF shapes list them slowest-first.
        shape = tuple(int(dim) for dim in reversed(tensor.shape.tolist()))
        hf_name, heads = _hf_name(tensor.name, config, architecture)
        if hf_name is None:
            raise ValueError(
                f"{gguf_path.name}: tensor {tensor.name!r} has no {architecture} counterpart"
            )
        if heads is not None and shape[0] % (2 * heads) != 0:
            raise ValueError(f"{tensor.name}: {shape[0]} rows do not split into {heads} heads")
        norm = tensor.name.endswith("norm.weight")
        shape = moe_tensor_shape(hf_name, shape)
        plans.append(_Plan(tensor.name, hf_name, shape, heads, shift if norm else 0.0))
    if latent:
        names = {tensor.name for tensor in reader.tensors}

        def join(keys: np.ndarray, values: np.ndarray) -> np.ndarray:
            return join_kv_b(keys, values, config)

        for hf_name, (k_b, v_b) in sorted(split_kv_b_layers(names).items()):
            if v_b not in names:
                raise ValueError(f"{gguf_path.name}: tensor {k_b!r} has no {v_b!r} beside it")
            plans.append(_Plan(k_b, hf_name, kv_b_shape(config), None, parts=(v_b,), join=join))
    return plans


def _hf_name(
    gguf_name: str, config: dict[str, Any], architecture: str = "llama"
) -> tuple[str | None, int | None]:
    routed = moe_tensor_name(gguf_name, config)
    if routed is not None:
        return routed
    if gguf_name in _GLOBAL_TENSOR_NAMES:
        return _GLOBAL_TENSOR_NAMES[gguf_name], None
    match = _LAYER_TENSOR.fullmatch(gguf_name)
    names = {**LAYER_NAMES, **_ARCHITECTURE_LAYER_NAMES.get(architecture, {})}
    if match is None or match.group(2) not in names:
        return None, None
    layer, kind = match.groups()
    heads = None
    if architecture in _INTERLEAVED_ROPE:
        heads = {
            "attn_q": config["num_attention_heads"],
            "attn_k": config["num_key_value_heads"],
        }.get(kind)
    return f"model.layers.{layer}.{names[kind]}.weight", heads


def unpermute_rope_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row order so rope pairs dimension i with i + head_dim/2.

    llama.cpp's converter interleaves each head's two rotary halves (rows i and i + d/2
    become neighbours 2i and 2i+1) for its own rope kernel; HF's rotate_half expects halves.
    """
    rows = weight.shape[0]
    half = rows // heads // 2
    by_head = weight.reshape(heads, half, 2, *weight.shape[1:])
    return np.ascontiguousarray(by_head.swapaxes(1, 2).reshape(weight.shape))


def _dequantize(tensor: Any, shape: Sequence[int]) -> np.ndarray:
    from gguf.quants import dequantize

    values = dequantize(tensor.data, tensor.tensor_type)
    return np.ascontiguousarray(values.reshape(shape), dtype=np.float32)


def _write_safetensors(path: Path, reader: Any, plans: list[_Plan], *, progress: bool) -> None:
    """Stream tensors into a safetensors file so only one dequantized tensor is in memory."""
    from tqdm import tqdm

    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for plan in plans:
        size = 4 * int(np.prod(plan.shape, dtype=np.int64))
        header[plan.hf_name] = {
            "dtype": "F32",
            "shape": list(plan.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    # The format wants the data section to start 8-byte aligned; spaces are valid JSON padding.
    encoded += b" " * (-len(encoded) % 8)
    by_name = {tensor.name: tensor for tensor in reader.tensors}
    with open(path, "wb") as sink:
        sink.write(struct.pack("<Q", len(encoded)))
        sink.write(encoded)
        bar = tqdm(plans, desc="exporting GGUF weights", unit="tensor", disable=not progress)
        for plan in bar:
            if plan.join is not None:
                tensors = [by_name[name] for name in (plan.gguf_name, *plan.parts)]
                parts = [_dequantize(tensor, (int(tensor.n_elements),)) for tensor in tensors]
                weight = plan.join(*parts).reshape(plan.shape)
            else:
                weight = _dequantize(by_name[plan.gguf_name], plan.shape)
            if plan.unpermute_heads is not None:
                weight = unpermute_rope_rows(weight, plan.unpermute_heads)
            if plan.shift:
                # Exact for stored scales in [0.5, 4): adding 1 back on loading gives the
                # stored value bit for bit.
                weight = weight - np.float32(plan.shift)
            sink.write(weight.astype("<f4", copy=False).data.cast("B"))


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    path.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
