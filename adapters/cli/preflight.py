"""Checks a model from its headers before `helios serve`, `generate` or `export` does any work."""

from __future__ import annotations

from pathlib import Path

from adapters.core.manifest import MODEL_SUBDIR, is_core_dir, load_core
from adapters.gpu.distributed.split import split_model
from adapters.gpu.factory import RunnerSettings, resolve_max_model_len
from adapters.gpu.loading.default_model import (
    cached_export_dir,
    default_gguf_path,
    resolve_model_dir,
)
from adapters.gpu.loading.gguf_export import gguf_layout
from adapters.gpu.loading.weights import (
    MissingTensorError,
    ShapeMismatchError,
    check_checkpoint,
    check_tensors,
)
from adapters.gpu.model.config import ModelConfig
from adapters.tokenizer.hf import read_tokenizer_files
from domain.speculation.drafts import SpeculativeConfig


class PreflightError(Exception):
    """A model that cannot load; the message is one line naming what and where."""


def check_models(
    model: str | None, runner: RunnerSettings, speculative: SpeculativeConfig | None = None
) -> ModelConfig:
    """Checks the served model (and a draft model) as far as headers allow: config.json, every
    tensor's name and shape (safetensors headers, GGUF tensor infos and quantization types),
    the tokenizer files, the tensor-parallel split and `--max-model-len`. No weight is read and
    nothing is exported.

    Returns the served model's config; raises PreflightError.
    """
    try:
        config = _checked_config(model)
        if runner.tensor_parallel_size > 1:
            split_model(config, runner.tensor_parallel_size, config.vocab_size)
        resolve_max_model_len(runner, config)
        if speculative is not None and speculative.model is not None:
            _checked_config(speculative.model)
    except (ValueError, KeyError, OSError) as error:
        raise PreflightError(_one_line(error)) from None
    return config


def check_model(model: str | None) -> ModelConfig:
    """`check_models` for one model alone (what `helios export` reads): config.json, every
    tensor's name and shape and the tokenizer files. Returns its config; raises PreflightError.
    """
    try:
        return _checked_config(model)
    except (ValueError, KeyError, OSError) as error:
        raise PreflightError(_one_line(error)) from None


def _checked_config(model: str | None) -> ModelConfig:
    if model is None:
        return _checked_gguf(default_gguf_path())
    path = Path(model).expanduser()
    if is_core_dir(path):
        load_core(path)
        return _checked_dir(path / MODEL_SUBDIR)
    if path.is_file() and path.suffix.lower() == ".gguf":
        return _checked_gguf(path)
    # A directory with config.json comes back as it is; anything else is refused by name.
    return _checked_dir(resolve_model_dir(model, progress=False))


def _checked_dir(model_dir: Path) -> ModelConfig:
    config = check_checkpoint(model_dir)
    read_tokenizer_files(model_dir)
    return config


def _checked_gguf(gguf_path: Path) -> ModelConfig:
    exported = cached_export_dir(gguf_path)
    if exported is not None:
        return _checked_dir(exported)
    layout = gguf_layout(gguf_path)
    try:
        config = ModelConfig.from_hf_dict(layout.config)
    except (ValueError, TypeError, KeyError) as error:
        raise ValueError(f"{gguf_path}: {error}") from None

    def shape_of(name: str) -> tuple[int, ...]:
        if name not in layout.shapes:
            raise MissingTensorError(f"{gguf_path} has no tensor that exports as {name!r}")
        return layout.shapes[name]

    try:
        check_tensors(config, shape_of)
    except ShapeMismatchError as error:
        raise ShapeMismatchError(
            error.names, error.got, error.expected, where=str(gguf_path)
        ) from None
    return config


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())
