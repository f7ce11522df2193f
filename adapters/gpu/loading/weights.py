"""Loads Hugging Face safetensors checkpoints into a `DecoderModel`."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from safetensors import safe_open

from adapters.gpu.distributed.collectives import Collectives
from adapters.gpu.distributed.split import RankSplit
from adapters.gpu.model.config import ModelConfig
from adapters.gpu.model.decoder import DecoderLayer, DecoderModel

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

TensorSource = Callable[[str], torch.Tensor]


class MissingTensorError(KeyError):
    """A checkpoint lacks a tensor the configuration requires."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "missing tensor"


class ShapeMismatchError(ValueError):
    """A checkpoint tensor (or the concatenation of `names`) has another shape than the model
    expects; `where` names the file(s) when known."""

    def __init__(
        self,
        names: Sequence[str],
        got: tuple[int, ...],
        expected: tuple[int, ...],
        where: str | None = None,
    ) -> None:
        self.names = tuple(names)
        self.got = tuple(got)
        self.expected = tuple(expected)
        self.where = where
        tensors = " + ".join(repr(name) for name in self.names)
        prefix = f"{where}: " if where else ""
        subject = "tensor" if len(self.names) == 1 else "tensors"
        verb = "has" if len(self.names) == 1 else "give"
        super().__init__(
            f"{prefix}{subject} {tensors} {verb} shape {self.got}, expected {self.expected}"
        )


def load_model(
    model_dir: Path | str,
    *,
    dtype: torch.dtype,
    device: torch.device | str,
    split: RankSplit | None = None,
    collectives: Collectives | None = None,
    batch_invariant: bool = False,
) -> DecoderModel:
    """Reads `config.json` and the safetensors weights (single file or sharded) of `model_dir`;
    with a `split`, only this rank's part of each tensor is kept. `batch_invariant` builds the
    model with the batch-invariant kernels (`DecoderModel`)."""
    model_dir = Path(model_dir)
    config = ModelConfig.from_dir(model_dir)
    with _Checkpoint.open(model_dir) as checkpoint, checkpoint.locating_mismatches():
        return build_model(
            config,
            lambda key: checkpoint.handle(key).get_tensor(key),
            dtype=dtype,
            device=device,
            split=split,
            collectives=collectives,
            batch_invariant=batch_invariant,
        )


def check_checkpoint(model_dir: Path | str) -> ModelConfig:
    """Checks that `model_dir` holds every tensor `load_model` reads, in the shape it expects,
    from `config.json` and the safetensors headers alone: no weight is read.

    Raises ValueError (a bad config.json, a ShapeMismatchError), MissingTensorError or
    FileNotFoundError, each naming the file.
    """
    model_dir = Path(model_dir)
    config = ModelConfig.from_dir(model_dir)
    with _Checkpoint.open(model_dir) as checkpoint, checkpoint.locating_mismatches():
        check_tensors(config, lambda key: tuple(checkpoint.handle(key).get_slice(key).get_shape()))
    return config


def check_tensors(config: ModelConfig, shape_of: Callable[[str], tuple[int, ...]]) -> None:
    """Raises what `build_model` would raise for a checkpoint whose tensor `name` has shape
    `shape_of(name)` (MissingTensorError where it has none), without any weight.

    It runs `build_model` itself on the meta device, so it asks for exactly the names and
    shapes the loader asks for, whatever the family.
    """

    def empty(key: str) -> torch.Tensor:
        return torch.empty(shape_of(key), dtype=torch.float32, device="meta")

    try:
        build_model(config, empty, dtype=torch.float32, device="meta")
    except RuntimeError as error:
        # A family's loader that combines tensors before checking their shapes fails in torch.
        raise ValueError(
            f"the checkpoint's tensors do not fit {config.architecture}: {error}"
        ) from None


@dataclass
class _Checkpoint:
    """The open safetensors files of a checkpoint directory and which file holds each tensor."""

    directory: Path
    handles: dict[str, Any]
    owner: dict[str, str]
    names_by_file: dict[str, set[str]]

    @classmethod
    @contextmanager
    def open(cls, model_dir: Path) -> Iterator[_Checkpoint]:
        files, owner = _checkpoint_files(model_dir)
        with ExitStack() as stack:
            handles = {}
            for name in files:
                try:
                    handles[name] = stack.enter_context(safe_open(model_dir / name, framework="pt"))
                except Exception as error:  # safetensors raises its own error type
                    raise ValueError(
                        f"{model_dir / name} is not a readable safetensors file: {error}"
                    ) from None
            names_by_file = {name: set(handle.keys()) for name, handle in handles.items()}
            if owner is None:
                owner = {key: name for name, keys in names_by_file.items() for key in keys}
            yield cls(model_dir, handles, owner, names_by_file)

    def handle(self, key: str) -> Any:
        """The open file that holds `key`; MissingTensorError where none does."""
        file_name = self.owner.get(key)
        if file_name is None:
            raise MissingTensorError(f"checkpoint in {self.directory} lacks tensor {key!r}")
        if key not in self.names_by_file.get(file_name, ()):
            raise MissingTensorError(
                f"{self.directory / file_name} lacks tensor {key!r} (the index puts it there)"
            )
        return self.handles[file_name]

    @contextmanager
    def locating_mismatches(self) -> Iterator[None]:
        """Adds the file(s) holding the tensors to a ShapeMismatchError raised inside."""
        try:
            yield
        except ShapeMismatchError as error:
            files = sorted({str(self.directory / self.owner[name]) for name in error.names})
            raise ShapeMismatchError(
                error.names, error.got, error.expected, where=", ".join(files)
            ) from None


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
) -> DecoderModel:
    """Fills a new `DecoderModel` from tensors named as in Hugging Face Llama checkpoints.

    `source(name)` returns the tensor with that name or raises `MissingTensorError` (a KeyError);
    other loaders (GGUF) reuse this by renaming their tensors to the HF names. A `split` keeps
    this rank's heads, MLP columns and vocabulary lanes of each tensor.
    """
    device = torch.device(device)
    model = DecoderModel(
        config,
        dtype=dtype,
        device=device,
        split=split,
        collectives=collectives,
        batch_invariant=batch_invariant,
    )
    cuts = _cuts(config, split)

    def fill(target: torch.Tensor, names: Iterable[str], role: str | None = None) -> None:
        cut = cuts[role] if role is not None else None
        names = list(names)
        parts = [_cut(_fetch(source, name), cut) for name in names]
        # Concatenated parts (gate and up) share the target's rows evenly.
        rows = [target.shape[0] // len(parts)] * len(parts)
        target.copy_(_joined(parts, names, rows, target))

    def fill_qkv(target: torch.Tensor, layer: DecoderLayer, attention: str, suffix: str) -> None:
        names = [f"{attention}{p}_proj.{suffix}" for p in "qkv"]
        parts = [_cut(_fetch(source, names[0]), cuts["q"])]
        parts += [_cut(_fetch(source, name), cuts["kv"]) for name in names[1:]]
        kv_rows = layer.num_kv_heads * layer.head_dim
        rows = [layer.num_heads * layer.head_dim, kv_rows, kv_rows]
        target.copy_(_joined(parts, names, rows, target))

    with torch.no_grad():
        fill(model.embed_weight, ["model.embed_tokens.weight"], "vocab")
        fill(model.norm_weight, ["model.norm.weight"])
        if not config.tie_word_embeddings:
            fill(model.lm_head_weight, ["lm_head.weight"], "vocab")
        for index, module in enumerate(model.layers):
            layer = cast(DecoderLayer, module)
            prefix = f"model.layers.{index}."
            attention = prefix + "self_attn."
            mlp = prefix + "mlp."
            fill(layer.input_norm, [prefix + "input_layernorm.weight"])
            fill(layer.post_attention_norm, [prefix + "post_attention_layernorm.weight"])
            fill_qkv(layer.qkv_weight, layer, attention, "weight")
            if layer.qkv_bias is not None:
                fill_qkv(layer.qkv_bias, layer, attention, "bias")
            fill(layer.output_weight, [attention + "o_proj.weight"], "o")
            if layer.output_bias is not None:
                fill(layer.output_bias, [attention + "o_proj.bias"])
            gate_up = [mlp + "gate_proj.weight", mlp + "up_proj.weight"]
            fill(layer.gate_up_weight, gate_up, "inner")
            if layer.gate_up_bias is not None:
                fill(layer.gate_up_bias, [mlp + "gate_proj.bias", mlp + "up_proj.bias"], "inner")
            fill(layer.down_weight, [mlp + "down_proj.weight"], "down")
            if layer.down_bias is not None:
                fill(layer.down_bias, [mlp + "down_proj.bias"])
    return model.eval()


def _joined(
    parts: list[torch.Tensor], names: list[str], rows: list[int], target: torch.Tensor
) -> torch.Tensor:
    """`parts` concatenated along rows into `target`'s shape, after checking each part holds
    its `rows` and the target's other dimensions (ShapeMismatchError naming the part)."""
    for part, name, count in zip(parts, names, rows, strict=True):
        expected = (count, *target.shape[1:])
        if tuple(part.shape) != expected:
            raise ShapeMismatchError([name], tuple(part.shape), expected)
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)


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
        try:
            with index_path.open(encoding="utf-8") as handle:
                index = json.load(handle)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"{index_path} is not valid JSON: {error}") from None
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
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
