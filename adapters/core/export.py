"""Export a model as a core directory, or describe a plain model as the full core it serves as."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from adapters.core import core_pb2
from adapters.core.manifest import (
    MODEL_SUBDIR,
    LoadedCore,
    build_manifest,
    core_from_manifest,
    is_core_dir,
    load_core,
    write_manifest,
)
from adapters.gpu.factory import padded_capacity
from adapters.gpu.loading.default_model import resolve_model_dir
from adapters.gpu.model.config import ModelConfig
from domain.logprobs.values import NATURAL_TOP_K


@dataclass(frozen=True, slots=True)
class CoreSizes:
    """How large a core's buffers are: sequences at once, completion tokens a step (0: the
    default) and the prefill chunk limit (positive: prompt scoring is declared)."""

    max_num_seqs: int = 16
    token_capacity: int = 0
    prompt_chunk_limit: int = 0

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be positive, got {self.max_num_seqs}")

    def manifest(self, config: ModelConfig, logprobs: str, top_k: int) -> core_pb2.CoreManifest:
        """The manifest of `config`'s model at these sizes, with `logprobs` and `top_k`."""
        return build_manifest(
            config.architecture,
            config.vocab_size,
            logprobs=logprobs,
            top_k=top_k,
            capacity=padded_capacity(self.max_num_seqs),
            token_capacity=self.token_capacity,
            prompt_chunk_limit=self.prompt_chunk_limit,
        )


DEFAULT_SIZES = CoreSizes()


def export_core(
    model: str | None,
    output: Path,
    *,
    logprobs: str = "full",
    top_k: int = NATURAL_TOP_K,
    sizes: CoreSizes = DEFAULT_SIZES,
    cache_dir: Path | None = None,
    progress: bool = True,
) -> LoadedCore:
    """Writes the core of `model` to `output` and returns it loaded and validated.

    `model` is anything `resolve_model_dir` accepts (None: the embedded default), or an existing
    core, which is exported again with the new settings. The weights and tokenizer land in
    `output/model/` as hard links to the source files where the file system allows, else copies.
    `output` must not exist yet, or be an empty directory; it appears complete or not at all.
    """
    output = Path(output)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise FileExistsError(f"export target {output} exists and is not an empty directory")
    core_dir = _core_dir(model)
    if core_dir is not None:
        source = core_dir / MODEL_SUBDIR
    else:
        source = resolve_model_dir(model, cache_dir=cache_dir, progress=progress)
    manifest = sizes.manifest(ModelConfig.from_dir(source), logprobs, top_k)
    output.parent.mkdir(parents=True, exist_ok=True)
    # Built beside the target and renamed into place, so a failed export leaves no half core.
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        _link_tree(source, staging / MODEL_SUBDIR)
        write_manifest(staging, manifest)
        load_core(staging)
        if output.exists():
            output.rmdir()
        staging.rename(output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return load_core(output)


def describe_plain_model(model_dir: Path, sizes: CoreSizes = DEFAULT_SIZES) -> LoadedCore:
    """The full core a plain model directory serves as, built in memory; nothing is written.

    Every recipe exports the complete bundle, so a model served without `helios export` has
    the full logprob contract (K=20 and selected IDs); it scores prompts when `sizes` has a
    positive prefill chunk limit.
    """
    model_dir = Path(model_dir)
    manifest = sizes.manifest(ModelConfig.from_dir(model_dir), "full", NATURAL_TOP_K)
    return core_from_manifest(model_dir, manifest)


def resolve_core(
    model: str | None,
    sizes: CoreSizes = DEFAULT_SIZES,
    *,
    cache_dir: Path | None = None,
    progress: bool = True,
) -> LoadedCore:
    """What `helios serve MODEL` runs: an exported core as declared, anything else as full.

    A positive prefill chunk limit in `sizes` asks for prompt scoring: a plain model is
    described with it, and a core that declares none is refused. A core that declares scoring
    serves it at the capacities it declares, whatever the limit.
    """
    core_dir = _core_dir(model)
    if core_dir is not None:
        core = load_core(core_dir)
        if sizes.prompt_chunk_limit > 0 and not core.capability.scores_prompts:
            raise ValueError(
                f"core {model} declares no prompt scoring; export it again with "
                f"--prompt-logprobs to serve prompt logprobs"
            )
        return core
    model_dir = resolve_model_dir(model, cache_dir=cache_dir, progress=progress)
    return describe_plain_model(model_dir, sizes)


def _core_dir(model: str | None) -> Path | None:
    """`model` as an exported core's directory; None for a model directory, file or name."""
    if model is None:
        return None
    path = Path(model).expanduser()
    return path if is_core_dir(path) else None


def _link_tree(source: Path, target: Path) -> None:
    """Mirrors `source` into `target`, hard-linking each file and copying where links fail."""
    for directory, _, files in os.walk(source):
        relative = Path(directory).relative_to(source)
        (target / relative).mkdir(parents=True, exist_ok=True)
        for name in files:
            origin = Path(directory) / name
            destination = target / relative / name
            try:
                os.link(origin, destination)
            except OSError:
                # Another file system, or one without hard links: a copy is as good.
                shutil.copy2(origin, destination)
