"""Checks a core's graphs: operations, outputs and the input bindings the buffer table assigns."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from domain.contract.buffers import (
    COMPLETION_LOGPROBS,
    PROMPT_LOGPROBS,
    PROMPT_TARGET_TOKENS,
    BufferGroup,
    contract_buffer,
    input_sources,
)
from domain.contract.capabilities import LogprobCapability
from domain.contract.declarations import (
    OPERATIONS,
    SCORED_PREFILL,
    VALUE_SOURCES,
    BufferDeclaration,
    GraphDeclaration,
)

# Each logprob graph input is the declared buffer of the same name, fed from its own source.
_LOGPROB_INPUT_SOURCES = input_sources(BufferGroup.NATURAL, BufferGroup.SELECTED_IDS)
_TARGET = (PROMPT_TARGET_TOKENS, contract_buffer(PROMPT_TARGET_TOKENS).source)


def check_graphs(
    graphs: Iterable[GraphDeclaration],
    declared: Mapping[str, BufferDeclaration],
    capability: LogprobCapability,
    scoring: bool,
    ladder: tuple[int, ...],
    problems: list[str],
) -> None:
    """Adds a problem for each graph that breaks the contract of the declared buffers.

    `capability` is what the completion buffers declare, `scoring` whether any prompt buffer
    is declared, and `ladder` the scored capacities of the declared C (empty without one).
    """
    unique = _index_graphs(graphs, problems)
    for graph in unique:
        _check_graph(graph, declared, capability, problems)
        _check_scoring_graph(graph, scoring, problems)
    if ladder:
        scored = sum(graph.operation == SCORED_PREFILL for graph in unique)
        if scored != len(ladder):
            problems.append(
                f"{PROMPT_LOGPROBS}: expected {len(ladder)} {SCORED_PREFILL} graphs "
                f"for C={ladder[-1]} (capacities {', '.join(map(str, ladder))}), got {scored}"
            )


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
    bound_logprob_inputs = _check_logprob_bindings(graph, declared, problems)
    writes_logprobs = COMPLETION_LOGPROBS in graph.outputs
    if bound_logprob_inputs and not (graph.samples or writes_logprobs):
        problems.append(
            f"{label}: binds logprob inputs but neither samples nor outputs "
            f"{COMPLETION_LOGPROBS}; graphs without logprob outputs receive no logprob inputs"
        )
    if not capability.enabled or not (graph.samples or writes_logprobs):
        return
    for buffer_name, source in input_sources(*capability.generation_groups).items():
        if (buffer_name, source) not in graph.inputs:
            problems.append(
                f"{label}: expected input binding {buffer_name} <- {source}, missing "
                f"(graphs that sample or write {COMPLETION_LOGPROBS} bind it)"
            )


def _check_logprob_bindings(
    graph: GraphDeclaration, declared: Mapping[str, BufferDeclaration], problems: list[str]
) -> bool:
    """Checks each binding's source and logprob pairing; True when it binds a logprob input."""
    label = f"graph {graph.name!r}"
    bound = False
    for input_name, source in graph.inputs:
        if source not in VALUE_SOURCES:
            problems.append(f"{label}: input {input_name!r} has unknown value source {source!r}")
        for buffer_name, buffer_source in _LOGPROB_INPUT_SOURCES.items():
            if (input_name == buffer_name) != (source == buffer_source):
                problems.append(
                    f"{label}: expected input binding {buffer_name} <- {buffer_source}, "
                    f"got {input_name} <- {source}"
                )
            elif input_name == buffer_name:
                bound = True
                if buffer_name not in declared:
                    problems.append(
                        f"{label}: binds {buffer_name} <- {buffer_source}, "
                        f"but the core declares no {buffer_name} buffer"
                    )
    return bound


def _check_scoring_graph(graph: GraphDeclaration, scoring: bool, problems: list[str]) -> None:
    """Only scored prefills read prompt targets and write prompt logprobs, and each does both."""
    label = f"graph {graph.name!r}"
    binds_target = any(
        input_name == _TARGET[0] or source == _TARGET[1] for input_name, source in graph.inputs
    )
    if graph.operation != SCORED_PREFILL:
        if binds_target:
            problems.append(
                f"{label}: binds {_TARGET[0]} <- {_TARGET[1]}, "
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
        if (input_name == _TARGET[0]) != (source == _TARGET[1]):
            problems.append(
                f"{label}: expected input binding {_TARGET[0]} <- {_TARGET[1]}, "
                f"got {input_name} <- {source}"
            )
    if not binds_target:
        problems.append(
            f"{label}: expected input binding {_TARGET[0]} <- {_TARGET[1]}, missing "
            f"({SCORED_PREFILL} graphs bind it)"
        )
    if PROMPT_LOGPROBS not in graph.outputs:
        problems.append(
            f"{label}: expected output {PROMPT_LOGPROBS}, missing "
            f"({SCORED_PREFILL} graphs write it)"
        )
