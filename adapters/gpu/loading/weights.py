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
    context_length: int | None = None,
    progress: bool = False,
) -> DecoderModel:
    """Reads `config.json` and the safetensors weights (single file or sharded) of `model_dir`;
    with a `split`, only this rank's part of each tensor is kept. `batch_invariant` builds the
    model with the batch-invariant kernels, `context_length` is the longest sequence served
    (both as `DecoderModel` takes them). `progress` shows a bar on stderr over the tensors read."""
    model_dir = Path(model_dir)
    config = ModelConfig.from_dir(model_dir)
    with (
        _Checkpoint.open(model_dir) as checkpoint,
        checkpoint.locating_mismatches(),
        _TensorProgress(len(checkpoint.owner), enabled=progress) as bar,
    ):
        return build_model(
            config,
            bar.counting(lambda key: checkpoint.handle(key).get_tensor(key)),
            dtype=dtype,
            device=device,
            split=split,
            collectives=collectives,
            batch_invariant=batch_invariant,
            context_length=context_length,
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


class _TensorProgress:
    """A tqdm bar on stderr over the distinct tensors a load reads, as the GGUF export shows
    one over the tensors it writes; a disabled bar prints nothing."""

    def __init__(self, total: int, *, enabled: bool) -> None:
        from tqdm import tqdm

        self._bar = tqdm(
            total=total, desc="loading safetensors weights", unit="tensor", disable=not enabled
        )
        self._seen: set[str] = set()

    def __enter__(self) -> _TensorProgress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if exc_info[0] is None and self._bar.n < (self._bar.total or 0):
            # Tensors the model never reads (a tied head's copy, old rotary buffers) are not
            # loaded either; the finished bar counts what was.
            self._bar.total = self._bar.n
            self._bar.refresh()
        self._bar.close()

    def counting(self, source: TensorSource) -> TensorSource:
        """`source`, advancing the bar the first time each name is read."""

        def read(key: str) -> torch.Tensor:
            tensor = source(key)
            if key not in self._seen:
                self._seen.add(key)
                self._bar.update(1)
            return tensor

        return read


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
        names = list(names)
        parts = [_cut(_fetch(source, name), cut) for name in names]
        # Concatenated parts (gate and up) share the target's rows evenly.
        rows = [target.shape[0] // len(parts)] * len(parts)
        target.copy_(_joined(parts, names, rows, target))

    def fill_norm(target: torch.Tensor, name: str) -> None:
        tensor = _joined([_fetch(source, name)], [name], [target.shape[0]], target)
        target.copy_(tensor.to(torch.float32) + offset if offset else tensor)

    def qkv_parts(attention: str, suffix: str) -> tuple[list[torch.Tensor], list[str]]:
        """The query, key and value parts, and the checkpoint name of each."""
        if not fused:
            names = [f"{attention}{p}_proj.{suffix}" for p in "qkv"]
            return [_fetch(source, name) for name in names], names
        name = f"{attention}qkv_proj.{suffix}"
        whole = _fetch(source, name)
        query_rows = config.num_attention_heads * config.head_dim
        kv_rows = config.num_key_value_heads * config.head_dim
        rows = (query_rows, kv_rows, kv_rows)
        if whole.shape[0] != sum(rows):
            raise ShapeMismatchError([name], tuple(whole.shape), (sum(rows), *whole.shape[1:]))
        return list(whole.split(rows, dim=0)), [name] * 3

    def fill_qkv(target: torch.Tensor, layer: DecoderLayer, attention: str, suffix: str) -> None:
        (query, key, value), names = qkv_parts(attention, suffix)
        parts = [_cut(query, cuts["q"]), _cut(key, cuts["kv"]), _cut(value, cuts["kv"])]
        kv_rows = layer.num_kv_heads * layer.head_dim
        rows = [layer.num_heads * layer.head_dim, kv_rows, kv_rows]
        target.copy_(_joined(parts, names, rows, target))

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
            raise ShapeMismatchError([name], tuple(whole.shape), (2 * inner, *whole.shape[1:]))
        gate, up = whole.split(inner, dim=0)
        parts = [_cut(gate, cuts["inner"]), _cut(up, cuts["inner"])]
        target.copy_(_joined(parts, [name, name], [target.shape[0] // 2] * 2, target))

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
                fill_qkv(layer.qkv_weight, layer, attention, "weight")
                if layer.qkv_bias is not None:
                    fill_qkv(layer.qkv_bias, layer, attention, "bias")
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


def _joined(
    parts: list[torch.Tensor], names: list[str], rows: list[int], target: torch.Tensor
) -> torch.Tensor:
    """`parts` concatenated along rows into `target`'s shape, after checking each part holds
    its `rows` and the target's other dimensions (ShapeMismatchError naming the part)."""
    for part, name, count in zip(parts, names, rows, strict=True):
        expected = (count, *target.shape[1:])
        if tuple(part.shape) != expected:
            raise ShapeMismatchError([name], tuple(part.shape), expected)
    if target.is_meta:
        # The start-up check builds on the meta device and needs the shapes only; `torch.cat`
        # of meta tensors runs a Python decomposition that imports torch._dynamo, 1.4-3 s of
        # a `helios serve` start.
        return target
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
