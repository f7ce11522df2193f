"""Core manifests: build the declarations our executor provides, write, read and load them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from google.protobuf import text_format
from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper
from google.protobuf.message import DecodeError

from adapters.core import core_pb2
from domain.contract.buffers import BufferGroup, ContractBuffer, buffers_in
from domain.contract.capabilities import (
    NO_LOGPROBS,
    LogprobCapability,
    natural_top_k_problem,
    scored_capacities,
)
from domain.contract.core_validation import CoreValidationError, validate_declarations
from domain.contract.declarations import SCORED_PREFILL, BufferDeclaration, GraphDeclaration
from domain.contract.records import resolve_token_capacity
from domain.logprobs.values import NATURAL_TOP_K

FORMAT_VERSION = 1
MANIFEST_FILE = "core.pb"
MANIFEST_TEXT_FILE = "core.txt"
MODEL_SUBDIR = "model"
LOGPROB_LEVELS = ("none", "natural", "full")

# The ordinary inputs of every graph our torch executor runs, fed from these host values.
_ORDINARY_INPUTS = (
    ("input_tokens", "INPUT_TOKENS"),
    ("positions", "POSITIONS"),
    ("block_tables", "BLOCK_TABLES"),
    ("slot_mapping", "SLOT_MAPPING"),
    ("sampling_parameters", "SAMPLING_PARAMETERS"),
)
# Both graphs sample: the last chunk of a prompt commits its first generated token.
_GRAPHS = (("prefill", "PREFILL"), ("decode", "DECODE"))


@dataclass(frozen=True)
class LoadedCore:
    """A validated core: where its weights and tokenizer are, its sizes and logprob capability."""

    model_dir: Path
    capacity: int
    token_capacity: int
    capability: LogprobCapability
    manifest: core_pb2.CoreManifest = field(compare=False, repr=False)


def build_manifest(
    architecture: str,
    vocab_size: int,
    *,
    logprobs: str,
    top_k: int = NATURAL_TOP_K,
    capacity: int,
    token_capacity: int,
    prompt_chunk_limit: int = 0,
) -> core_pb2.CoreManifest:
    """The manifest of the buffers and graphs our executor provides at a logprob level.

    `logprobs` is "none" (records only), "natural" (K = `top_k` alternatives, no selected IDs)
    or "full" (the complete bundle; K must be 20). `token_capacity` is stored as given, so 0
    keeps meaning "the default T". A positive `prompt_chunk_limit` adds prompt scoring: the two
    prompt buffers for C = the limit and one scored prefill per capacity of its ladder, after
    the ordinary declarations, which it leaves as they are.
    """
    if logprobs not in LOGPROB_LEVELS:
        raise ValueError(f"logprobs must be one of {', '.join(LOGPROB_LEVELS)}, not {logprobs!r}")
    capability = _level_capability(logprobs, top_k)
    if capacity < 1:
        raise ValueError(f"capacity must be positive, got {capacity}")
    if prompt_chunk_limit < 0:
        raise ValueError(f"prompt_chunk_limit must be non-negative, got {prompt_chunk_limit}")
    if prompt_chunk_limit:
        # The capability refuses scoring without K=20 generation outputs.
        ladder = scored_capacities(prompt_chunk_limit)
        capability = replace(capability, scored_capacities=ladder)
    manifest = core_pb2.CoreManifest(
        format_version=FORMAT_VERSION,
        model=core_pb2.ModelInfo(architecture=architecture, vocab_size=vocab_size),
        capacity=capacity,
        completion_token_capacity=token_capacity,
    )
    _declare(manifest, capability, capacity, resolve_token_capacity(token_capacity))
    return manifest


def _level_capability(logprobs: str, top_k: int) -> LogprobCapability:
    """The generation capability of a logprob level; the domain's rules refuse a wrong K."""
    if logprobs == "none":
        return NO_LOGPROBS
    if logprobs == "natural" and (problem := natural_top_k_problem(top_k)):
        raise ValueError(problem)
    return LogprobCapability(top_k=top_k, selects_ids=logprobs == "full")


def _declare(
    manifest: core_pb2.CoreManifest,
    capability: LogprobCapability,
    capacity: int,
    token_capacity: int,
) -> None:
    """Adds the buffers `capability` declares, in table order, and the graphs that use them."""
    for buffer in capability.buffers:
        dtype, shape = capability.form(buffer, capacity, token_capacity)
        manifest.buffers.add(
            name=buffer.name, dtype=core_pb2.DType.Value(dtype.upper()), shape=shape
        )
    generation = buffers_in(*capability.generation_groups)
    for graph_name, operation in _GRAPHS:
        _add_graph(manifest, graph_name, operation, generation)
    # Scored prefills also bind the prompt targets and write the prompt rows.
    scored = (*generation, *buffers_in(BufferGroup.PROMPT_SCORING))
    for rows in capability.scored_capacities:
        _add_graph(manifest, f"scored_prefill_{rows}", SCORED_PREFILL, scored)


def _add_graph(
    manifest: core_pb2.CoreManifest,
    name: str,
    operation: str,
    buffers: Sequence[ContractBuffer],
) -> None:
    """Appends a graph that binds the ordinary inputs and `buffers`' inputs, writing the rest."""
    outputs = [buffer.name for buffer in buffers if buffer.source is None]
    graph = manifest.graphs.add(
        name=name, operation=core_pb2.Operation.Value(operation), outputs=outputs
    )
    inputs = (*_ORDINARY_INPUTS, *((b.name, b.source) for b in buffers if b.source is not None))
    for input_name, source in inputs:
        graph.inputs.add(input=input_name, source=core_pb2.ValueSource.Value(source))


def write_manifest(directory: Path, manifest: core_pb2.CoreManifest) -> None:
    """Writes `core.pb` and its human-readable twin `core.txt` into `directory`."""
    directory = Path(directory)
    (directory / MANIFEST_FILE).write_bytes(manifest.SerializeToString(deterministic=True))
    (directory / MANIFEST_TEXT_FILE).write_text(
        text_format.MessageToString(manifest), encoding="utf-8"
    )


def is_core_dir(path: Path) -> bool:
    return (Path(path) / MANIFEST_FILE).is_file()


def read_manifest(directory: Path) -> core_pb2.CoreManifest:
    """Parses `core.pb`; `core.txt` is for people and is never read."""
    path = Path(directory) / MANIFEST_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{Path(directory)} is not a core: it has no {MANIFEST_FILE}")
    manifest = core_pb2.CoreManifest()
    try:
        manifest.ParseFromString(path.read_bytes())
    except DecodeError as error:
        raise CoreValidationError(f"{path} is not a core manifest: {error}") from error
    return manifest


def load_core(directory: Path) -> LoadedCore:
    """Reads and validates the core in `directory`.

    Malformed declarations raise CoreValidationError naming the buffer or graph and the form it
    expected; the weights and tokenizer are not opened here.
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    model_dir = directory / MODEL_SUBDIR
    if not (model_dir / "config.json").is_file():
        raise CoreValidationError(f"core {directory} has no {MODEL_SUBDIR}/config.json")
    return core_from_manifest(model_dir, manifest)


def core_from_manifest(model_dir: Path, manifest: core_pb2.CoreManifest) -> LoadedCore:
    """Validates `manifest` into a LoadedCore whose weights and tokenizer live in `model_dir`."""
    if manifest.format_version != FORMAT_VERSION:
        raise CoreValidationError(
            f"core manifest format version {manifest.format_version} is not supported "
            f"(this Helios reads version {FORMAT_VERSION})"
        )
    token_capacity = resolve_token_capacity(manifest.completion_token_capacity)
    try:
        buffers, graphs = buffer_declarations(manifest), graph_declarations(manifest)
    except CoreValidationError:
        raise
    except ValueError as error:
        raise CoreValidationError(str(error)) from error
    capability = validate_declarations(
        buffers, graphs, capacity=manifest.capacity, token_capacity=token_capacity
    )
    return LoadedCore(
        model_dir=Path(model_dir),
        capacity=manifest.capacity,
        token_capacity=token_capacity,
        capability=capability,
        manifest=manifest,
    )


def buffer_declarations(manifest: core_pb2.CoreManifest) -> list[BufferDeclaration]:
    return [
        BufferDeclaration(
            name=buffer.name,
            dtype=_enum_name(core_pb2.DType, buffer.dtype).lower(),
            shape=tuple(buffer.shape),
        )
        for buffer in manifest.buffers
    ]


def graph_declarations(manifest: core_pb2.CoreManifest) -> list[GraphDeclaration]:
    return [
        GraphDeclaration(
            name=graph.name,
            operation=_enum_name(core_pb2.Operation, graph.operation),
            inputs=tuple(
                (binding.input, _enum_name(core_pb2.ValueSource, binding.source))
                for binding in graph.inputs
            ),
            outputs=tuple(graph.outputs),
        )
        for graph in manifest.graphs
    ]


def _enum_name(enum: EnumTypeWrapper, number: int) -> str:
    # proto3 keeps numbers it does not know (a newer writer); validation then names them.
    try:
        return enum.Name(number)
    except ValueError:
        return f"#{number}"
