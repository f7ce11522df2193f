"""Export a llama-architecture GGUF file as a Hugging Face-style float32 model directory."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import struct
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# llama.cpp's token_type values (gguf.TokenType); only these two become added tokens.
_TOKEN_TYPE_CONTROL = 3
_TOKEN_TYPE_USER_DEFINED = 4

_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.weight")
_LAYER_TENSOR_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GLOBAL_TENSOR_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_SUPPORTED_PRE_TOKENIZERS = ("default", "gpt2", "smollm")
_MISSING = object()


@dataclass(frozen=True)
class _Plan:
    """One GGUF tensor and where its float32 rows go in model.safetensors."""

    gguf_name: str
    hf_name: str
    shape: tuple[int, ...]
    unpermute_heads: int | None


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
    tokenizer_json = _tokenizer_json(reader, gguf_path)
    plans = _tensor_plans(reader, config, gguf_path)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        _write_json(staging / "config.json", config)
        _write_json(staging / "generation_config.json", _generation_config(reader))
        _write_json(staging / "tokenizer_config.json", _tokenizer_config(reader, config))
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
    `export_gguf` applies (architecture, tensor types, tensor names), so that a file this
    accepts is one the export accepts. Raises ValueError naming the file."""
    gguf_path = Path(gguf_path)
    reader = open_gguf(gguf_path)
    config = _model_config(reader, gguf_path)
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


def _field(reader: Any, key: str, default: Any = _MISSING) -> Any:
    field = reader.fields.get(key)
    if field is None:
        if default is _MISSING:
            raise ValueError(f"GGUF metadata has no {key!r}")
        return default
    return field.contents()


def _float32_value(value: float) -> float:
    # GGUF stores these as float32; the shortest float32 spelling turns 9.9999997e-06 into 1e-05.
    return float(str(np.float32(value)))


def _model_config(reader: Any, gguf_path: Path) -> dict[str, Any]:
    architecture = _field(reader, "general.architecture")
    if architecture != "llama":
        raise ValueError(f"{gguf_path.name}: architecture {architecture!r} is not supported")
    scaling = _field(reader, "llama.rope.scaling.type", "none")
    if scaling not in ("none", ""):
        raise ValueError(f"{gguf_path.name}: rope scaling {scaling!r} is not supported")

    def key(name: str, default: Any = _MISSING) -> Any:
        return _field(reader, f"llama.{name}", default)

    tokens = _field(reader, "tokenizer.ggml.tokens")
    hidden_size = int(key("embedding_length"))
    heads = int(key("attention.head_count"))
    kv_heads = int(key("attention.head_count_kv", heads))
    head_dim = int(key("attention.key_length", hidden_size // heads))
    rope_theta = _float32_value(key("rope.freq_base", 10000.0))
    tensor_names = {tensor.name for tensor in reader.tensors}
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
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
    for name in ("bos", "eos", "padding"):
        token_id = _field(reader, f"tokenizer.ggml.{name}_token_id", None)
        if token_id is not None:
            config["pad_token_id" if name == "padding" else f"{name}_token_id"] = int(token_id)
    return config


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


def _tokenizer_config(reader: Any, config: dict[str, Any]) -> dict[str, Any]:
    tokens = _field(reader, "tokenizer.ggml.tokens")
    tokenizer_config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(_field(reader, "tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": config["max_position_embeddings"],
    }
    for role, key in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding")):
        token_id = _field(reader, f"tokenizer.ggml.{key}_token_id", None)
        if token_id is not None and 0 <= int(token_id) < len(tokens):
            tokenizer_config[f"{role}_token"] = tokens[int(token_id)]
    template = _field(reader, "tokenizer.chat_template", None)
    if template:
        tokenizer_config["chat_template"] = template
    return tokenizer_config


def _tokenizer_json(reader: Any, gguf_path: Path) -> str:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    kind = _field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"{gguf_path.name}: tokenizer model {kind!r} is not supported")
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    if pre not in _SUPPORTED_PRE_TOKENIZERS:
        raise ValueError(
            f"{gguf_path.name}: pre-tokenizer {pre!r} is not supported "
            f"(supported: {', '.join(_SUPPORTED_PRE_TOKENIZERS)})"
        )
    tokens: list[str] = _field(reader, "tokenizer.ggml.tokens")
    token_types: list[int] = _field(reader, "tokenizer.ggml.token_type", [])
    vocab = {piece: token_id for token_id, piece in enumerate(tokens)}
    model = models.BPE(vocab=vocab, merges=_merge_pairs(_field(reader, "tokenizer.ggml.merges")))
    tokenizer = Tokenizer(model)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        # llama.cpp's smollm pre-tokenizer isolates every digit before the GPT-2 split.
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    else:
        tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel()
    if token_types and len(token_types) != len(tokens):
        raise ValueError(
            f"{gguf_path.name}: {len(token_types)} token types for {len(tokens)} tokens"
        )
    typed = list(zip(tokens, token_types or [0] * len(tokens), strict=True))
    specials = [p for p, kind_id in typed if kind_id == _TOKEN_TYPE_CONTROL]
    user_defined = [p for p, kind_id in typed if kind_id == _TOKEN_TYPE_USER_DEFINED]
    # Control pieces are already in the vocabulary, so adding them keeps their IDs.
    tokenizer.add_special_tokens([AddedToken(p, special=True, normalized=False) for p in specials])
    tokenizer.add_tokens([AddedToken(p, special=False, normalized=False) for p in user_defined])
    return tokenizer.to_str(pretty=False)


def _merge_pairs(merges: Iterable[str]) -> list[tuple[str, str]]:
    pairs = []
    for merge in merges:
        parts = merge.split(" ")
        if len(parts) != 2:
            raise ValueError(f"GGUF merge {merge!r} is not two pieces separated by one space")
        pairs.append((parts[0], parts[1]))
    return pairs


def _tensor_plans(reader: Any, config: dict[str, Any], gguf_path: Path) -> list[_Plan]:
    plans = []
    for tensor in reader.tensors:
        # GGUF lists dimensions fastest-first; row-major HF shapes list them slowest-first.
        shape = tuple(int(dim) for dim in reversed(tensor.shape.tolist()))
        hf_name, heads = _hf_name(tensor.name, config)
        if hf_name is None:
            raise ValueError(f"{gguf_path.name}: tensor {tensor.name!r} has no llama counterpart")
        if heads is not None and shape[0] % (2 * heads) != 0:
            raise ValueError(f"{tensor.name}: {shape[0]} rows do not split into {heads} heads")
        plans.append(_Plan(tensor.name, hf_name, shape, heads))
    return plans


def _hf_name(gguf_name: str, config: dict[str, Any]) -> tuple[str | None, int | None]:
    if gguf_name in _GLOBAL_TENSOR_NAMES:
        return _GLOBAL_TENSOR_NAMES[gguf_name], None
    match = _LAYER_TENSOR.fullmatch(gguf_name)
    if match is None or match.group(2) not in _LAYER_TENSOR_NAMES:
        return None, None
    layer, kind = match.groups()
    heads = {
        "attn_q": config["num_attention_heads"],
        "attn_k": config["num_key_value_heads"],
    }.get(kind)
    return f"model.layers.{layer}.{_LAYER_TENSOR_NAMES[kind]}.weight", heads


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
            weight = _dequantize(by_name[plan.gguf_name], plan.shape)
            if plan.unpermute_heads is not None:
                weight = unpermute_rope_rows(weight, plan.unpermute_heads)
            sink.write(weight.astype("<f4", copy=False).data.cast("B"))


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    path.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
