"""Validates a core's buffer and graph declarations into the logprob capability it serves."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from domain.logprobs import FULL_POSITION_WORDS, MAX_SELECTED_IDS, NATURAL_TOP_K
from domain.prompt_scores import PROMPT_ROW_WORDS
from domain.records import HEADER_WORDS

COMPLETION_RECORDS = "completion_records"
COMPLETION_LOGPROBS = "completion_logprobs"
LOGPROB_REQUESTED = "logprob_requested"
LOGPROB_TOKEN_IDS = "logprob_token_ids"
LOGPROB_TOKEN_ID_COUNTS = "logprob_token_id_counts"
PROMPT_LOGPROBS = "prompt_logprobs"
PROMPT_TARGET_TOKENS = "prompt_target_tokens"
PROMPT_BUFFERS = (PROMPT_LOGPROBS, PROMPT_TARGET_TOKENS)
SCORED_PREFILL = "SCORED_PREFILL"
PROMPT_TARGET_SOURCE = "PROMPT_TARGET_TOKEN"
# The smallest scored graph, and the factor between neighbouring capacities below the limit.
FIRST_SCORED_CAPACITY = 128
SCORED_CAPACITY_GROWTH = 4

LOGPROB_BUFFERS = (
    COMPLETION_LOGPROBS,
    LOGPROB_REQUESTED,
    LOGPROB_TOKEN_IDS,
    LOGPROB_TOKEN_ID_COUNTS,
)
ID_BUFFERS = (LOGPROB_TOKEN_IDS, LOGPROB_TOKEN_ID_COUNTS)
COMPLETION_FRAMES = 2

DTYPES = frozenset({"int32", "int64", "float32", "bfloat16", "float16", "uint8", "bool"})
OPERATIONS = frozenset({"PREFILL", "DECODE", "MIXED", "VERIFY", "SCORED_PREFILL"})
# Graphs that commit generated tokens; in a logprob core each one binds the flag vector.
# A graph of any other operation that writes completion_logprobs must bind it too. A scored
# prefill may sample the final chunk's next token, so it is held to the same rule.
SAMPLING_OPERATIONS = frozenset({"DECODE", "MIXED", "VERIFY", SCORED_PREFILL})
VALUE_SOURCES = frozenset(
    {
        "INPUT_TOKENS",
        "POSITIONS",
        "BLOCK_TABLES",
        "SLOT_MAPPING",
        "SAMPLING_PARAMETERS",
        "LOGPROB_REQUESTED",
        "LOGPROB_TOKEN_IDS",
        "LOGPROB_TOKEN_ID_COUNTS",
        "PROMPT_TARGET_TOKEN",
    }
)
# Each logprob graph input is the declared buffer of the same name, fed from this source.
LOGPROB_INPUT_SOURCES: Mapping[str, str] = {
    LOGPROB_REQUESTED: "LOGPROB_REQUESTED",
    LOGPROB_TOKEN_IDS: "LOGPROB_TOKEN_IDS",
    LOGPROB_TOKEN_ID_COUNTS: "LOGPROB_TOKEN_ID_COUNTS",
}


class CoreValidationError(ValueError):
    """A core's declarations break the buffer contract; the core must not load."""


def describe_form(dtype: str, shape: Iterable[int | str]) -> str:
    """The `int32[2, 16, 8, 258]` spelling that validation messages use."""
    return f"{dtype}[{', '.join(str(extent) for extent in shape)}]"


def scored_capacities(chunk_limit: int) -> tuple[int, ...]:
    """Row capacities of the scored prefill graphs for a prefill chunk limit, ascending.

    They start at 128 and grow fourfold while below the limit, which always ends the ladder:
    512 -> (128, 512), 1000 -> (128, 512, 1000), 100 -> (100,).
    """
    if isinstance(chunk_limit, bool) or not isinstance(chunk_limit, int) or chunk_limit < 1:
        raise ValueError(f"the prompt chunk limit must be a positive integer, got {chunk_limit!r}")
    ladder = []
    capacity = FIRST_SCORED_CAPACITY
    while capacity < chunk_limit:
        ladder.append(capacity)
        capacity *= SCORED_CAPACITY_GROWTH
    ladder.append(chunk_limit)
    return tuple(ladder)


def prompt_shapes(rows: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The prompt-scoring buffers: name -> (dtype, shape) for C = `rows` scored rows."""
    return {
        PROMPT_LOGPROBS: ("int32", (COMPLETION_FRAMES, rows, PROMPT_ROW_WORDS)),
        PROMPT_TARGET_TOKENS: ("int32", (rows,)),
    }


@dataclass(frozen=True, slots=True)
class BufferDeclaration:
    """A named device buffer: element type (lower-case, e.g. "int32") and row-major shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("a buffer needs a non-empty name")
        if not isinstance(self.dtype, str):
            raise ValueError(f"buffer {self.name!r}: dtype must be a string")
        shape = tuple(self.shape)
        for extent in shape:
            if isinstance(extent, bool) or not isinstance(extent, int) or extent < 0:
                raise ValueError(f"buffer {self.name!r}: extents must be non-negative integers")
        object.__setattr__(self, "shape", shape)

    @property
    def form(self) -> str:
        return describe_form(self.dtype, self.shape)


@dataclass(frozen=True, slots=True)
class GraphDeclaration:
    """A graph: its operation name, (input name, value source name) bindings and output buffers."""

    name: str
    operation: str
    inputs: tuple[tuple[str, str], ...] = ()
    outputs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("a graph needs a non-empty name")
        inputs = tuple(tuple(binding) for binding in self.inputs)
        for binding in inputs:
            if len(binding) != 2 or not all(isinstance(part, str) for part in binding):
                raise ValueError(f"graph {self.name!r}: bindings are (input, source) strings")
        object.__setattr__(self, "inputs", inputs)
        object.__setattr__(self, "outputs", tuple(self.outputs))

    @property
    def samples(self) -> bool:
        return self.operation in SAMPLING_OPERATIONS


@dataclass(frozen=True, slots=True)
class LogprobCapability:
    """What a core's logprob declarations allow.

    `top_k` natural alternatives per position (0: the core reports no logprobs), whether
    requests may select token IDs instead (only full cores, which also have K=20), and the
    row capacities of its scored prefill graphs (empty: the core does not score prompts;
    otherwise the ladder of its largest, C, and K must be 20).
    """

    top_k: int
    selects_ids: bool
    scored_capacities: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.top_k <= NATURAL_TOP_K:
            raise ValueError(f"top_k must be within 0..{NATURAL_TOP_K}, got {self.top_k}")
        if self.selects_ids and self.top_k == 0:
            raise ValueError("a core that selects token IDs must also report logprobs")
        capacities = tuple(self.scored_capacities)
        object.__setattr__(self, "scored_capacities", capacities)
        if not capacities:
            return
        if any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in capacities):
            raise ValueError(f"scored capacities must be positive integers, got {capacities}")
        ladder = scored_capacities(max(capacities))
        if capacities != ladder:
            raise ValueError(
                f"scored capacities must be the ladder {ladder} of their largest, got {capacities}"
            )
        if self.top_k != NATURAL_TOP_K:
            raise ValueError(
                f"prompt scoring requires K={NATURAL_TOP_K} generation logprobs, got K={self.top_k}"
            )

    @property
    def enabled(self) -> bool:
        return self.top_k > 0

    @property
    def scores_prompts(self) -> bool:
        return bool(self.scored_capacities)

    @property
    def scored_rows(self) -> int:
        """C, the largest scored capacity (the prompt chunk limit); 0 without scoring."""
        return self.scored_capacities[-1] if self.scored_capacities else 0

    @property
    def position_words(self) -> int:
        """Last extent of completion_logprobs: 0 without logprobs, 258 with selected IDs."""
        if self.selects_ids:
            return FULL_POSITION_WORDS
        return 2 + 2 * self.top_k if self.enabled else 0


NO_LOGPROBS = LogprobCapability(top_k=0, selects_ids=False)
FULL_LOGPROBS = LogprobCapability(top_k=NATURAL_TOP_K, selects_ids=True)


def contract_shapes(capacity: int, token_capacity: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The full completion bundle: buffer name -> (dtype, shape) for `capacity` slots and T."""
    frames = (COMPLETION_FRAMES, capacity)
    return {
        COMPLETION_RECORDS: ("int64", (*frames, HEADER_WORDS + token_capacity)),
        COMPLETION_LOGPROBS: ("int32", (*frames, token_capacity, FULL_POSITION_WORDS)),
        LOGPROB_REQUESTED: ("int32", (capacity,)),
        LOGPROB_TOKEN_IDS: ("int32", (capacity, MAX_SELECTED_IDS)),
        LOGPROB_TOKEN_ID_COUNTS: ("int32", (capacity,)),
    }


def logprob_capability(
    buffers: Iterable[BufferDeclaration],
    graphs: Iterable[GraphDeclaration],
    *,
    capacity: int,
    token_capacity: int,
) -> LogprobCapability:
    """The capability the declarations describe, or CoreValidationError listing every problem.

    `capacity` is the padded physical request capacity, `token_capacity` the resolved T.
    """
    if capacity < 1 or token_capacity < 1:
        raise CoreValidationError(
            f"capacity and completion token capacity must be positive, "
            f"got {capacity} and {token_capacity}"
        )
    problems: list[str] = []
    declared = _index_buffers(buffers, problems)
    expected = contract_shapes(capacity, token_capacity)
    before = len(problems)
    capability = _buffer_capability(declared, expected, problems)
    bundle_valid = len(problems) == before
    rows = _scored_rows(declared, problems)
    scoring = any(name in declared for name in PROMPT_BUFFERS)
    # A malformed completion bundle is reported already; its stand-in K would only add noise.
    if scoring and bundle_valid and capability.top_k != NATURAL_TOP_K:
        problems.append(
            f"{PROMPT_LOGPROBS}: prompt scoring requires K={NATURAL_TOP_K} generation logprob "
            f"outputs ({COMPLETION_LOGPROBS} with last extent {2 + 2 * NATURAL_TOP_K}, or the "
            f"full bundle), got {f'K={capability.top_k}' if capability.enabled else 'none'}"
        )
    graphs = _index_graphs(graphs, problems)
    for graph in graphs:
        _check_graph(graph, declared, capability, problems)
        _check_scoring_graph(graph, scoring, problems)
    ladder = scored_capacities(rows) if rows else ()
    if rows:
        scored = sum(graph.operation == SCORED_PREFILL for graph in graphs)
        if scored != len(ladder):
            problems.append(
                f"{PROMPT_LOGPROBS}: expected {len(ladder)} {SCORED_PREFILL} graphs for C={rows} "
                f"(capacities {', '.join(map(str, ladder))}), got {scored}"
            )
    if problems:
        raise CoreValidationError("; ".join(problems))
    return replace(capability, scored_capacities=ladder)


def _index_buffers(
    buffers: Iterable[BufferDeclaration], problems: list[str]
) -> dict[str, BufferDeclaration]:
    declared: dict[str, BufferDeclaration] = {}
    for buffer in buffers:
        if buffer.name in declared:
            problems.append(f"{buffer.name}: declared more than once")
        elif buffer.dtype not in DTYPES:
            problems.append(f"{buffer.name}: unknown dtype {buffer.dtype!r}")
        declared[buffer.name] = buffer
    return declared


def _index_graphs(
    graphs: Iterable[GraphDeclaration], problems: list[str]
) -> list[GraphDeclaration]:
    seen: set[str] = set()
    unique = []
    for graph in graphs:
        if graph.name in seen:
            problems.append(f"graph {graph.name!r}: declared more than once")
            continue
        seen.add(graph.name)
        unique.append(graph)
    return unique


def _check_form(
    declared: Mapping[str, BufferDeclaration],
    name: str,
    form: tuple[str, tuple[int, ...]],
    problems: list[str],
    why_required: str,
) -> None:
    """Adds a problem unless `name` is declared with exactly `form`."""
    expected = describe_form(*form)
    buffer = declared.get(name)
    if buffer is None:
        problems.append(f"{name}: expected {expected}, missing ({why_required})")
    elif (buffer.dtype, buffer.shape) != form:
        problems.append(f"{name}: expected {expected}, got {buffer.form}")


def _buffer_capability(
    declared: Mapping[str, BufferDeclaration],
    expected: Mapping[str, tuple[str, tuple[int, ...]]],
    problems: list[str],
) -> LogprobCapability:
    present = [name for name in LOGPROB_BUFFERS if name in declared]
    if COMPLETION_RECORDS in declared or present:
        reason = f"required with {present[0]}" if present else ""
        _check_form(declared, COMPLETION_RECORDS, expected[COMPLETION_RECORDS], problems, reason)
    if not present:
        return NO_LOGPROBS
    selecting = [name for name in ID_BUFFERS if name in declared]
    if selecting:
        reason = f"a core that declares {selecting[0]} must declare all five buffers"
        for name in LOGPROB_BUFFERS:
            _check_form(declared, name, expected[name], problems, reason)
        return FULL_LOGPROBS
    reason = f"required with {present[0]}"
    _check_form(declared, LOGPROB_REQUESTED, expected[LOGPROB_REQUESTED], problems, reason)
    top_k = _natural_top_k(declared, expected[COMPLETION_LOGPROBS][1], problems, reason)
    # Problems are already recorded; any valid value keeps the graph checks meaningful.
    return LogprobCapability(top_k=top_k or 1, selects_ids=False)


def _scored_rows(declared: Mapping[str, BufferDeclaration], problems: list[str]) -> int:
    """C from the prompt-scoring buffers (0 when neither is declared), checking both forms.

    C comes from whichever buffer is well formed, prompt_logprobs first; the other must then
    have exactly the form for that C.
    """
    present = [name for name in PROMPT_BUFFERS if name in declared]
    if not present:
        return 0
    rows = next(filter(None, (_rows_of(declared.get(name)) for name in PROMPT_BUFFERS)), 0)
    if rows:
        forms = prompt_shapes(rows)
        for name in PROMPT_BUFFERS:
            _check_form(declared, name, forms[name], problems, f"required with {present[0]}")
        return rows
    generic = {
        PROMPT_LOGPROBS: describe_form("int32", (COMPLETION_FRAMES, "C", PROMPT_ROW_WORDS)),
        PROMPT_TARGET_TOKENS: describe_form("int32", ("C",)),
    }
    for name in PROMPT_BUFFERS:
        buffer = declared.get(name)
        got = buffer.form if buffer is not None else f"missing (required with {present[0]})"
        problems.append(f"{name}: expected {generic[name]} with C >= 1, got {got}")
    return 0


def _rows_of(buffer: BufferDeclaration | None) -> int:
    """C if `buffer` has its prompt-scoring form for some C >= 1, else 0."""
    if buffer is None or buffer.dtype != "int32":
        return 0
    if buffer.name == PROMPT_TARGET_TOKENS and len(buffer.shape) == 1:
        return buffer.shape[0]
    shape = buffer.shape
    if len(shape) == 3 and shape[0] == COMPLETION_FRAMES and shape[2] == PROMPT_ROW_WORDS:
        return shape[1]
    return 0


def _natural_top_k(
    declared: Mapping[str, BufferDeclaration],
    full_shape: tuple[int, ...],
    problems: list[str],
    why_required: str,
) -> int:
    """K from a natural-only completion_logprobs (last extent 2+2*K), or 0 after a problem."""
    frame_shape = full_shape[:-1]
    expected = f"{describe_form('int32', (*frame_shape, '2+2*K'))} with 1 <= K <= {NATURAL_TOP_K}"
    buffer = declared.get(COMPLETION_LOGPROBS)
    if buffer is None:
        problems.append(f"{COMPLETION_LOGPROBS}: expected {expected}, missing ({why_required})")
        return 0
    shape = buffer.shape
    if buffer.dtype == "int32" and len(shape) == len(full_shape) and shape[:-1] == frame_shape:
        words = shape[-1]
        top_k, odd = divmod(words - 2, 2)
        if not odd and 1 <= top_k <= NATURAL_TOP_K:
            return top_k
    problems.append(f"{COMPLETION_LOGPROBS}: expected {expected}, got {buffer.form}")
    return 0


def _check_graph(
    graph: GraphDeclaration,
    declared: Mapping[str, BufferDeclaration],
    capability: LogprobCapability,
    problems: list[str],
) -> None:
    label = f"graph {graph.name!r}"
    if graph.operation not in OPERATIONS:
        problems.append(
            f"{label}: expected an operation in {', '.join(sorted(OPERATIONS))}, "
            f"got {graph.operation!r}"
        )
    for output in graph.outputs:
        if output not in declared:
            problems.append(f"{label}: output {output!r} is not a declared buffer")
    bound_logprob_inputs = False
    for input_name, source in graph.inputs:
        if source not in VALUE_SOURCES:
            problems.append(f"{label}: input {input_name!r} has unknown value source {source!r}")
        for buffer_name, buffer_source in LOGPROB_INPUT_SOURCES.items():
            if (input_name == buffer_name) != (source == buffer_source):
                problems.append(
                    f"{label}: expected input binding {buffer_name} <- {buffer_source}, "
                    f"got {input_name} <- {source}"
                )
            elif input_name == buffer_name:
                bound_logprob_inputs = True
                if buffer_name not in declared:
                    problems.append(
                        f"{label}: binds {buffer_name} <- {buffer_source}, "
                        f"but the core declares no {buffer_name} buffer"
                    )
    writes_logprobs = COMPLETION_LOGPROBS in graph.outputs
    if bound_logprob_inputs and not (graph.samples or writes_logprobs):
        problems.append(
            f"{label}: binds logprob inputs but neither samples nor outputs "
            f"{COMPLETION_LOGPROBS}; graphs without logprob outputs receive no logprob inputs"
        )
    if not capability.enabled or not (graph.samples or writes_logprobs):
        return
    required = [LOGPROB_REQUESTED, *(ID_BUFFERS if capability.selects_ids else ())]
    for buffer_name in required:
        binding = (buffer_name, LOGPROB_INPUT_SOURCES[buffer_name])
        if binding not in graph.inputs:
            problems.append(
                f"{label}: expected input binding {buffer_name} <- {binding[1]}, missing "
                f"(graphs that sample or write {COMPLETION_LOGPROBS} bind it)"
            )


def _check_scoring_graph(graph: GraphDeclaration, scoring: bool, problems: list[str]) -> None:
    """Only scored prefills read prompt targets and write prompt logprobs, and each does both."""
    label = f"graph {graph.name!r}"
    target = (PROMPT_TARGET_TOKENS, PROMPT_TARGET_SOURCE)
    binds_target = any(
        input_name == PROMPT_TARGET_TOKENS or source == PROMPT_TARGET_SOURCE
        for input_name, source in graph.inputs
    )
    if graph.operation != SCORED_PREFILL:
        if binds_target:
            problems.append(
                f"{label}: binds {PROMPT_TARGET_TOKENS} <- {PROMPT_TARGET_SOURCE}, "
                f"but only {SCORED_PREFILL} graphs read prompt targets"
            )
        if PROMPT_LOGPROBS in graph.outputs:
            problems.append(
                f"{label}: outputs {PROMPT_LOGPROBS}, but only {SCORED_PREFILL} graphs write it"
            )
        return
    if not scoring:
        problems.append(
            f"{label}: a {SCORED_PREFILL} graph needs the {PROMPT_LOGPROBS} and "
            f"{PROMPT_TARGET_TOKENS} buffers, which the core does not declare"
        )
    for input_name, source in graph.inputs:
        if (input_name == PROMPT_TARGET_TOKENS) != (source == PROMPT_TARGET_SOURCE):
            problems.append(
                f"{label}: expected input binding {target[0]} <- {target[1]}, "
                f"got {input_name} <- {source}"
            )
    if not binds_target:
        problems.append(
            f"{label}: expected input binding {target[0]} <- {target[1]}, missing "
            f"({SCORED_PREFILL} graphs bind it)"
        )
    if PROMPT_LOGPROBS not in graph.outputs:
        problems.append(
            f"{label}: expected output {PROMPT_LOGPROBS}, missing "
            f"({SCORED_PREFILL} graphs write it)"
        )
