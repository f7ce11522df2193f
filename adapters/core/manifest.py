"""Core manifests: build the declarations our executor provides, write, read and load them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf import text_format
from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper
from google.protobuf.message import DecodeError

from adapters.core import core_pb2
from domain.capabilities import (
    COMPLETION_LOGPROBS,
    COMPLETION_RECORDS,
    LOGPROB_BUFFERS,
    LOGPROB_INPUT_SOURCES,
    LOGPROB_REQUESTED,
    LOGPROB_TOKEN_ID_COUNTS,
    LOGPROB_TOKEN_IDS,
    PROMPT_LOGPROBS,
    PROMPT_TARGET_SOURCE,
    PROMPT_TARGET_TOKENS,
    SCORED_PREFILL,
    BufferDeclaration,
    CoreValidationError,
    GraphDeclaration,
    LogprobCapability,
    contract_shapes,
    logprob_capability,
    prompt_shapes,
    scored_capacities,
)
from domain.logprobs import NATURAL_TOP_K
from domain.records import resolve_token_capacity

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
    if logprobs == "full" and top_k != NATURAL_TOP_K:
        raise ValueError(f"full cores provide K={NATURAL_TOP_K} natural alternatives, not {top_k}")
    if logprobs == "natural" and not 1 <= top_k <= NATURAL_TOP_K:
        raise ValueError(f"natural cores need 1 <= top_k <= {NATURAL_TOP_K}, got {top_k}")
    if capacity < 1:
        raise ValueError(f"capacity must be positive, got {capacity}")
    if prompt_chunk_limit < 0:
        raise ValueError(f"prompt_chunk_limit must be non-negative, got {prompt_chunk_limit}")
    if prompt_chunk_limit and (logprobs == "none" or top_k != NATURAL_TOP_K):
        raise ValueError(
            f"prompt scoring requires K={NATURAL_TOP_K} generation logprob outputs "
            f"(logprobs full, or natural with top_k {NATURAL_TOP_K}), not {logprobs!r} "
            f"with top_k {top_k}"
        )
    forms = contract_shapes(capacity, resolve_token_capacity(token_capacity))
    names = {"none": (), "natural": LOGPROB_BUFFERS[:2], "full": LOGPROB_BUFFERS}[logprobs]
    if logprobs == "natural":
        dtype, shape = forms[COMPLETION_LOGPROBS]
        forms[COMPLETION_LOGPROBS] = (dtype, (*shape[:-1], 2 + 2 * top_k))
    manifest = core_pb2.CoreManifest(
        format_version=FORMAT_VERSION,
        model=core_pb2.ModelInfo(architecture=architecture, vocab_size=vocab_size),
        capacity=capacity,
        completion_token_capacity=token_capacity,
    )
    for name in (COMPLETION_RECORDS, *names):
        dtype, shape = forms[name]
        manifest.buffers.add(name=name, dtype=core_pb2.DType.Value(dtype.upper()), shape=shape)
    logprob_inputs = [name for name in names if name in LOGPROB_INPUT_SOURCES]
    outputs = [COMPLETION_RECORDS, *(names[:1])]
    for graph_name, operation in _GRAPHS:
        graph = manifest.graphs.add(
            name=graph_name, operation=core_pb2.Operation.Value(operation), outputs=outputs
        )
        for input_name, source in (*_ORDINARY_INPUTS, *_logprob_bindings(logprob_inputs)):
            graph.inputs.add(input=input_name, source=core_pb2.ValueSource.Value(source))
    if prompt_chunk_limit:
        _add_scoring(manifest, prompt_chunk_limit, logprob_inputs, [*outputs, PROMPT_LOGPROBS])
    return manifest


def _add_scoring(
    manifest: core_pb2.CoreManifest,
    chunk_limit: int,
    logprob_inputs: Sequence[str],
    outputs: Sequence[str],
) -> None:
    """Appends the prompt buffers and one scored prefill per capacity of the ladder."""
    for name, (dtype, shape) in prompt_shapes(chunk_limit).items():
        manifest.buffers.add(name=name, dtype=core_pb2.DType.Value(dtype.upper()), shape=shape)
    bindings = (
        *_ORDINARY_INPUTS,
        *_logprob_bindings(logprob_inputs),
        (PROMPT_TARGET_TOKENS, PROMPT_TARGET_SOURCE),
    )
    for capacity in scored_capacities(chunk_limit):
        graph = manifest.graphs.add(
            name=f"scored_prefill_{capacity}",
            operation=core_pb2.Operation.Value(SCORED_PREFILL),
            outputs=outputs,
        )
        for input_name, source in bindings:
            graph.inputs.add(input=input_name, source=core_pb2.ValueSource.Value(source))


def _logprob_bindings(names: Sequence[str]) -> list[tuple[str, str]]:
    order = (LOGPROB_REQUESTED, LOGPROB_TOKEN_IDS, LOGPROB_TOKEN_ID_COUNTS)
    return [(name, LOGPROB_INPUT_SOURCES[name]) for name in order if name in names]


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
    capability = logprob_capability(
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
