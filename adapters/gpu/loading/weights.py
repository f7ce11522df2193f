"""Loads Hugging Face safetensors checkpoints into a `DecoderModel`."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from pathlib import Path
from typing import cast

import torch
from safetensors import safe_open

from adapters.gpu.distributed.collectives import Collectives
from adapters.gpu.distributed.split import RankSplit
from adapters.gpu.loading.expert_weights import fill_experts, fill_latent_attention
from adapters.gpu.model.config import SUPPORTED_ARCHITECTURES, ModelConfig
from adapters.gpu.model.decoder import DecoderLayer, DecoderModel

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

TensorSource = Callable[[str], torch.Tensor]


class MissingTensorError(KeyError):
    """A checkpoint lacks a tensor the configuration requires."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "missing tensor"


def load_model(
    model_dir: Path | str,
    *,
    dtype: torch.dtype,
    device: torch.device | str,
    split: RankSplit | None = None,
    collectives: Collectives | None = None,
    batch_invariant: bool = False,
    context_length: int | None = None,
) -> DecoderModel:
    """Reads `config.json` and the safetensors weights (single file or sharded) of `model_dir`;
    with a `split`, only this rank's part of each tensor is kept. `batch_invariant` builds the
    model with the batch-invariant kernels, `context_length` is the longest sequence served
    (both as `DecoderModel` takes them)."""
    model_dir = Path(model_dir)
    config = ModelConfig.from_dir(model_dir)
    files, owner = _checkpoint_files(model_dir)
    with ExitStack() as stack:
        handles = {
            name: stack.enter_context(safe_open(model_dir / name, framework="pt")) for name in files
        }
        names_by_file = {name: set(handle.keys()) for name, handle in handles.items()}
        if owner is None:
            owner = {key: name for name, keys in names_by_file.items() for key in keys}

        def source(key: str) -> torch.Tensor:
            file_name = owner.get(key)
            if file_name is None or key not in names_by_file.get(file_name, ()):
                raise MissingTensorError(f"checkpoint in {model_dir} lacks tensor {key!r}")
            return handles[file_name].get_tensor(key)

        return build_model(
            config,
            source,
            dtype=dtype,
            device=device,
            split=split,
            collectives=collectives,
            batch_invariant=batch_invariant,
            context_length=context_length,
        )


# Which slice of a checkpoint tensor a rank keeps: (dimension, [start, stop)) or None (all).
_Cut = tuple[int, tuple[int, int]] | None


def _cuts(config: ModelConfig, split: RankSplit | None) -> dict[str, _Cut]:
    """Per tensor role, the rows or columns this rank keeps (all of them without a split)."""
    if split is None or split.whole:
        return dict.fromkeys(("q", "kv", "o", "inner", "down", "vocab"))
    head_dim = config.head_dim

    def heads(span: tuple[int, int]) -> tuple[int, int]:
        return span[0] * head_dim, span[1] * head_dim

    return {
        "q": (0, heads(split.query_heads)),
        "kv": (0, heads(split.kv_heads)),
        "o": (1, heads(split.query_heads)),
        "inner": (0, split.inner),
        "down": (1, split.inner),
        "vocab": (0, split.vocab),
    }


def build_model(
    config: ModelConfig,
    source: TensorSource,
    *,
    dtype: torch.dtype,
    device: torch.device | str,
    split: RankSplit | None = None,
    collectives: Collectives | None = None,
    batch_invariant: bool = False,
    context_length: int | None = None,
) -> DecoderModel:
    """Fills a new `DecoderModel` from tensors named as in Hugging Face Llama checkpoints.

    `source(name)` returns the tensor with that name or raises `MissingTensorError` (a KeyError);
    other loaders (GGUF) reuse this by renaming their tensors to the HF names. A `split` keeps
    this rank's heads, MLP columns and vocabulary lanes of each tensor. Phi-3's fused
    `qkv_proj` and `gate_up_proj` are cut into their parts first, so each rank keeps its heads
    and columns of each part; Gemma 3's norm weights gain the config's offset (1) in float32.
    """
    device = torch.device(device)
    model = DecoderModel(
        config,
        dtype=dtype,
        device=device,
        split=split,
        collectives=collectives,
        batch_invariant=batch_invariant,
        context_length=context_length,
    )
    cuts = _cuts(config, split)
    fused = SUPPORTED_ARCHITECTURES[config.architecture] == "phi3"
    offset = config.norm_weight_offset

    def fill(target: torch.Tensor, names: Iterable[str], role: str | None = None) -> None:
        cut = cuts[role] if role is not None else None
        parts = [_cut(_fetch(source, name), cut) for name in names]
        tensor = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
        if tuple(tensor.shape) != tuple(target.shape):
            raise ValueError(
                f"tensor {' + '.join(names)} has shape {tuple(tensor.shape)}, "
                f"expected {tuple(target.shape)}"
            )
        target.copy_(tensor)

    def fill_norm(target: torch.Tensor, name: str) -> None:
        tensor = _fetch(source, name)
        if offset:
            tensor = tensor.to(torch.float32) + offset
        if tuple(tensor.shape) != tuple(target.shape):
            raise ValueError(
                f"tensor {name} has shape {tuple(tensor.shape)}, expected {tuple(target.shape)}"
            )
        target.copy_(tensor)

    def qkv_parts(attention: str, suffix: str) -> list[torch.Tensor]:
        if not fused:
            return [_fetch(source, f"{attention}{p}_proj.{suffix}") for p in "qkv"]
        whole = _fetch(source, f"{attention}qkv_proj.{suffix}")
        query_rows = config.num_attention_heads * config.head_dim
        kv_rows = config.num_key_value_heads * config.head_dim
        if whole.shape[0] != query_rows + 2 * kv_rows:
            raise ValueError(
                f"tensor {attention}qkv_proj.{suffix} has {whole.shape[0]} rows, expected "
                f"{query_rows + 2 * kv_rows} (query, key and value heads)"
            )
        return list(whole.split((query_rows, kv_rows, kv_rows), dim=0))

    def fill_qkv(target: torch.Tensor, attention: str, suffix: str) -> None:
        query, key, value = qkv_parts(attention, suffix)
        parts = [_cut(query, cuts["q"]), _cut(key, cuts["kv"]), _cut(value, cuts["kv"])]
        tensor = torch.cat(parts, dim=0)
        if tuple(tensor.shape) != tuple(target.shape):
            raise ValueError(
                f"tensors {attention}q/k/v_proj.{suffix} give shape {tuple(tensor.shape)}, "
                f"expected {tuple(target.shape)}"
            )
        target.copy_(tensor)

    def fetch(name: str) -> torch.Tensor:
        return _fetch(source, name)

    def has(name: str) -> bool:
        try:
            source(name)
        except KeyError:
            return False
        return True

    flavour = SUPPORTED_ARCHITECTURES[config.architecture]

    def fill_fused_gate_up(target: torch.Tensor, name: str) -> None:
        whole = _fetch(source, name)
        inner = config.intermediate_size
        if whole.shape[0] != 2 * inner:
            raise ValueError(f"tensor {name} has {whole.shape[0]} rows, expected {2 * inner}")
        gate, up = whole.split(inner, dim=0)
        tensor = torch.cat((_cut(gate, cuts["inner"]), _cut(up, cuts["inner"])), dim=0)
        if tuple(tensor.shape) != tuple(target.shape):
            raise ValueError(
                f"tensor {name} gives shape {tuple(tensor.shape)}, expected {tuple(target.shape)}"
            )
        target.copy_(tensor)

    with torch.no_grad():
        fill(model.embed_weight, ["model.embed_tokens.weight"], "vocab")
        fill_norm(model.norm_weight, "model.norm.weight")
        if not config.tie_word_embeddings:
            fill(model.lm_head_weight, ["lm_head.weight"], "vocab")
        for index, module in enumerate(model.layers):
            layer = cast(DecoderLayer, module)
            prefix = f"model.layers.{index}."
            attention = prefix + "self_attn."
            mlp = prefix + "mlp."
            fill_norm(layer.input_norm, prefix + "input_layernorm.weight")
            if layer.attention_out_norm is not None and layer.mlp_out_norm is not None:
                # Gemma's sandwich: its post_attention_layernorm norms the attention output.
                fill_norm(layer.attention_out_norm, prefix + "post_attention_layernorm.weight")
                fill_norm(layer.post_attention_norm, prefix + "pre_feedforward_layernorm.weight")
                fill_norm(layer.mlp_out_norm, prefix + "post_feedforward_layernorm.weight")
            else:
                fill_norm(layer.post_attention_norm, prefix + "post_attention_layernorm.weight")
            if layer.q_norm is not None and layer.k_norm is not None:
                fill_norm(layer.q_norm, attention + "q_norm.weight")
                fill_norm(layer.k_norm, attention + "k_norm.weight")
            if layer.latent is not None:
                fill_latent_attention(layer.latent, fetch, attention, split)
            else:
                fill_qkv(layer.qkv_weight, attention, "weight")
                if layer.qkv_bias is not None:
                    fill_qkv(layer.qkv_bias, attention, "bias")
                fill(layer.output_weight, [attention + "o_proj.weight"], "o")
                if layer.output_bias is not None:
                    fill(layer.output_bias, [attention + "o_proj.bias"])
            if layer.experts is not None:
                fill_experts(layer.experts, fetch, has, prefix, flavour)
                continue
            if fused:
                fill_fused_gate_up(layer.gate_up_weight, mlp + "gate_up_proj.weight")
            else:
                gate_up = [mlp + "gate_proj.weight", mlp + "up_proj.weight"]
                fill(layer.gate_up_weight, gate_up, "inner")
            if layer.gate_up_bias is not None:
                fill(layer.gate_up_bias, [mlp + "gate_proj.bias", mlp + "up_proj.bias"], "inner")
            fill(layer.down_weight, [mlp + "down_proj.weight"], "down")
            if layer.down_bias is not None:
                fill(layer.down_bias, [mlp + "down_proj.bias"])
    return model.eval()


def _cut(tensor: torch.Tensor, cut: _Cut) -> torch.Tensor:
    if cut is None:
        return tensor
    dim, (start, stop) = cut
    return tensor.narrow(dim, start, stop - start)


def _fetch(source: TensorSource, name: str) -> torch.Tensor:
    try:
        return source(name)
    except MissingTensorError:
        raise
    except KeyError as error:
        raise MissingTensorError(f"checkpoint lacks tensor {name!r}") from error


def _checkpoint_files(model_dir: Path) -> tuple[list[str], dict[str, str] | None]:
    """The safetensors files to open, and the index's tensor -> file map when sharded."""
    index_path = model_dir / INDEX_FILE
    if index_path.is_file():
        with index_path.open(encoding="utf-8") as handle:
            weight_map = json.load(handle).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index_path} has no weight_map")
        files = sorted(set(weight_map.values()))
        for name in files:
            if not (model_dir / name).is_file():
                raise FileNotFoundError(f"shard {name} listed in {index_path} is missing")
        return files, dict(weight_map)
    if (model_dir / SINGLE_FILE).is_file():
        return [SINGLE_FILE], None
    raise FileNotFoundError(f"no {SINGLE_FILE} or {INDEX_FILE} in {model_dir}")
