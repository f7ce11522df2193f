"""Validates a core's declared buffers and graphs, against the buffer table, into its capability."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from domain.contract.buffers import (
    COMPLETION_LOGPROBS,
    COMPLETION_RECORDS,
    PROMPT_LOGPROBS,
    BufferGroup,
    ContractBuffer,
    buffers_in,
    contract_buffer,
)
from domain.contract.capabilities import (
    FULL_LOGPROBS,
    NO_LOGPROBS,
    LogprobCapability,
    natural_top_k_problem,
    scored_capacities,
    scoring_problem,
)
from domain.contract.declarations import DTYPES, BufferDeclaration, GraphDeclaration, describe_form
from domain.contract.graph_validation import check_graphs
from domain.logprobs.values import NATURAL_TOP_K


class CoreValidationError(ValueError):
    """A core's declarations break the buffer contract; the core must not load."""


def validate_declarations(
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
    before = len(problems)
    capability = _generation_capability(declared, capacity, token_capacity, problems)
    bundle_valid = len(problems) == before
    rows = _scored_rows(declared, capacity, token_capacity, problems)
    scoring = any(buffer.name in declared for buffer in buffers_in(BufferGroup.PROMPT_SCORING))
    # A malformed completion bundle is reported already; its stand-in K would only add noise.
    if scoring and bundle_valid and (problem := scoring_problem(capability.top_k)):
        problems.append(f"{PROMPT_LOGPROBS}: {problem}")
    ladder = scored_capacities(rows) if rows else ()
    check_graphs(graphs, declared, capability, scoring, ladder, problems)
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


def _declared_in(declared: Mapping[str, BufferDeclaration], *groups: BufferGroup) -> list[str]:
    return [buffer.name for buffer in buffers_in(*groups) if buffer.name in declared]


def _check_form(
    declared: Mapping[str, BufferDeclaration],
    name: str,
    form: tuple[str, tuple[int | str, ...]],
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


def _generation_capability(
    declared: Mapping[str, BufferDeclaration],
    capacity: int,
    token_capacity: int,
    problems: list[str],
) -> LogprobCapability:
    """The generation capability the completion buffers declare, checking each of their forms.

    The records come with any logprob buffer; a selected-ID input requires all five buffers at
    their table forms; otherwise the natural buffers, whose packed extent gives K.
    """
    present = _declared_in(declared, BufferGroup.NATURAL, BufferGroup.SELECTED_IDS)
    reason = f"required with {present[0]}" if present else ""
    if COMPLETION_RECORDS in declared or present:
        form = contract_buffer(COMPLETION_RECORDS).form(capacity, token_capacity)
        _check_form(declared, COMPLETION_RECORDS, form, problems, reason)
    if not present:
        return NO_LOGPROBS
    if selecting := _declared_in(declared, BufferGroup.SELECTED_IDS):
        reason = f"a core that declares {selecting[0]} must declare all five buffers"
        for buffer in buffers_in(BufferGroup.NATURAL, BufferGroup.SELECTED_IDS):
            form = buffer.form(capacity, token_capacity)
            _check_form(declared, buffer.name, form, problems, reason)
        return FULL_LOGPROBS
    for buffer in buffers_in(BufferGroup.NATURAL):
        if buffer.name != COMPLETION_LOGPROBS:
            form = buffer.form(capacity, token_capacity)
            _check_form(declared, buffer.name, form, problems, reason)
    packed = contract_buffer(COMPLETION_LOGPROBS)
    top_k = _natural_top_k(declared, packed.form(capacity, token_capacity), problems, reason)
    # Problems are already recorded; any valid value keeps the graph checks meaningful.
    return LogprobCapability(top_k=top_k or 1, selects_ids=False)


def _natural_top_k(
    declared: Mapping[str, BufferDeclaration],
    full_form: tuple[str, tuple[int | str, ...]],
    problems: list[str],
    why_required: str,
) -> int:
    """K from a natural-only completion_logprobs (last extent 2+2*K), or 0 after a problem."""
    dtype, full_shape = full_form
    frame_shape = full_shape[:-1]
    expected = f"{describe_form(dtype, (*frame_shape, '2+2*K'))} with 1 <= K <= {NATURAL_TOP_K}"
    buffer = declared.get(COMPLETION_LOGPROBS)
    if buffer is None:
        problems.append(f"{COMPLETION_LOGPROBS}: expected {expected}, missing ({why_required})")
        return 0
    shape = buffer.shape
    if buffer.dtype == dtype and len(shape) == len(full_shape) and shape[:-1] == frame_shape:
        top_k, odd = divmod(shape[-1] - 2, 2)
        if not odd and natural_top_k_problem(top_k) is None:
            return top_k
    problems.append(f"{COMPLETION_LOGPROBS}: expected {expected}, got {buffer.form}")
    return 0


def _scored_rows(
    declared: Mapping[str, BufferDeclaration],
    capacity: int,
    token_capacity: int,
    problems: list[str],
) -> int:
    """C from the prompt-scoring buffers (0 when neither is declared), checking both forms.

    C comes from whichever buffer is well formed, in table order; every prompt buffer must then
    have exactly its form for that C.
    """
    prompt = buffers_in(BufferGroup.PROMPT_SCORING)
    present = _declared_in(declared, BufferGroup.PROMPT_SCORING)
    if not present:
        return 0
    reason = f"required with {present[0]}"
    found = (_rows_of(buffer, declared, capacity, token_capacity) for buffer in prompt)
    rows = next(filter(None, found), 0)
    for buffer in prompt:
        if rows:
            form = buffer.form(capacity, token_capacity, rows)
            _check_form(declared, buffer.name, form, problems, reason)
            continue
        generic = describe_form(*buffer.form(capacity, token_capacity, "C"))
        declaration = declared.get(buffer.name)
        got = declaration.form if declaration is not None else f"missing ({reason})"
        problems.append(f"{buffer.name}: expected {generic} with C >= 1, got {got}")
    return rows


def _rows_of(
    buffer: ContractBuffer,
    declared: Mapping[str, BufferDeclaration],
    capacity: int,
    token_capacity: int,
) -> int:
    """C if `buffer` is declared with its table form for some C >= 1, else 0."""
    declaration = declared.get(buffer.name)
    _, generic = buffer.form(capacity, token_capacity, "C")
    if declaration is None or len(declaration.shape) != len(generic):
        return 0
    rows = declaration.shape[generic.index("C")]
    form = buffer.form(capacity, token_capacity, rows)
    return rows if rows >= 1 and (declaration.dtype, declaration.shape) == form else 0
