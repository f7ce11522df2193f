"""Builders of checkpoints a user might wrongly point Helios at: broken copies of a good HF
directory, and tiny llama GGUF files with a chosen architecture and tensor types."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

# The tiny GGUF's shape: hidden 64, 2 layers, 4 query and 2 key/value heads of 16, MLP 128.
_HIDDEN, _LAYERS, _HEADS, _KV_HEADS, _INNER, _VOCAB = 64, 2, 4, 2, 128, 256


def broken_copy(good: Path, target: Path) -> Path:
    """A copy of the model directory `good` at `target`, to break by hand."""
    shutil.copytree(good, target)
    return target


def edit_config(model_dir: Path, **changes: object) -> None:
    """Rewrites `config.json` with `changes` applied."""
    path = model_dir / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config.update(changes)
    path.write_text(json.dumps(config), encoding="utf-8")


def edit_tensors(
    model_dir: Path, *, drop: str | None = None, rows_off: Mapping[str, int] | None = None
) -> None:
    """Rewrites `model.safetensors` without tensor `drop`, and with `rows_off[name]` rows cut
    from the end of each named tensor."""
    path = model_dir / "model.safetensors"
    tensors = load_file(path)
    if drop is not None:
        del tensors[drop]
    for name, rows in (rows_off or {}).items():
        tensors[name] = np.ascontiguousarray(tensors[name][:-rows])
    save_file(tensors, path, metadata={"format": "pt"})


def write_tiny_gguf(
    path: Path,
    *,
    architecture: str = "llama",
    q8_1_tensor: str | None = None,
    unknown_type_tensor: str | None = None,
    tokenizer_model: str = "gpt2",
) -> Path:
    """Writes a random tiny llama GGUF (float32 tensors, llama.cpp names) to `path`.

    `q8_1_tensor` is stored as Q8_1 instead, a quantization type gguf knows but cannot
    dequantize; `unknown_type_tensor` gets type id 99, which no GGUF reader knows;
    `tokenizer_model` is written as `tokenizer.ggml.model`.
    """
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    prefix = architecture
    writer.add_uint32(f"{prefix}.context_length", 512)
    writer.add_uint32(f"{prefix}.embedding_length", _HIDDEN)
    writer.add_uint32(f"{prefix}.block_count", _LAYERS)
    writer.add_uint32(f"{prefix}.feed_forward_length", _INNER)
    writer.add_uint32(f"{prefix}.attention.head_count", _HEADS)
    writer.add_uint32(f"{prefix}.attention.head_count_kv", _KV_HEADS)
    writer.add_float32(f"{prefix}.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_tokenizer_model(tokenizer_model)
    # One merge, so that the byte-level tokenizer the export builds from these keys is whole.
    writer.add_token_list(["t0", "t1", "t0t1", *(f"t{index}" for index in range(3, _VOCAB))])
    writer.add_token_merges(["t0 t1"])
    generator = np.random.default_rng(0)
    for name, shape in _gguf_shapes().items():
        rows, columns = (shape[0], shape[1]) if len(shape) == 2 else (1, shape[0])
        if name == q8_1_tensor:
            # A quantization type gguf's Python package knows but cannot dequantize.
            block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_1]
            raw = generator.integers(0, 255, (rows, columns // block * size), dtype=np.uint8)
            writer.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType.Q8_1)
        else:
            values = generator.standard_normal(shape).astype(np.float32)
            writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if unknown_type_tensor is not None:
        _set_tensor_type(path, unknown_type_tensor, 99)
    return path


def _gguf_shapes() -> dict[str, tuple[int, ...]]:
    """Row-major shapes (slowest dimension first) of every tensor, by llama.cpp name."""
    head_dim = _HIDDEN // _HEADS
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (_VOCAB, _HIDDEN),
        "output_norm.weight": (_HIDDEN,),
        "output.weight": (_VOCAB, _HIDDEN),
    }
    for layer in range(_LAYERS):
        block = f"blk.{layer}."
        shapes |= {
            block + "attn_norm.weight": (_HIDDEN,),
            block + "attn_q.weight": (_HEADS * head_dim, _HIDDEN),
            block + "attn_k.weight": (_KV_HEADS * head_dim, _HIDDEN),
            block + "attn_v.weight": (_KV_HEADS * head_dim, _HIDDEN),
            block + "attn_output.weight": (_HIDDEN, _HEADS * head_dim),
            block + "ffn_norm.weight": (_HIDDEN,),
            block + "ffn_gate.weight": (_INNER, _HIDDEN),
            block + "ffn_up.weight": (_INNER, _HIDDEN),
            block + "ffn_down.weight": (_HIDDEN, _INNER),
        }
    return shapes


def _set_tensor_type(path: Path, tensor: str, type_id: int) -> None:
    """Overwrites the type id in `tensor`'s tensor info: after its name come the dimension
    count (u32), the dimensions (u64 each) and the type (u32), all little-endian."""
    data = bytearray(path.read_bytes())
    encoded = tensor.encode("utf-8")
    start = data.index(len(encoded).to_bytes(8, "little") + encoded) + 8 + len(encoded)
    dimensions = int.from_bytes(data[start : start + 4], "little")
    at = start + 4 + 8 * dimensions
    data[at : at + 4] = type_id.to_bytes(4, "little")
    path.write_bytes(bytes(data))
