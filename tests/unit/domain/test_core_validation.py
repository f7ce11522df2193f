"""Buffer and graph declarations validate into the logprob capability the seed assigns them."""

from __future__ import annotations

import re
from collections.abc import Iterable

import pytest

from domain.contract.capabilities import FULL_LOGPROBS, NO_LOGPROBS, LogprobCapability
from domain.contract.core_validation import CoreValidationError, validate_declarations
from domain.contract.declarations import BufferDeclaration, GraphDeclaration

CAPACITY = 16
T = 8
ORDINARY = (
    ("input_tokens", "INPUT_TOKENS"),
    ("positions", "POSITIONS"),
    ("block_tables", "BLOCK_TABLES"),
    ("slot_mapping", "SLOT_MAPPING"),
    ("sampling_parameters", "SAMPLING_PARAMETERS"),
)
FLAG = ("logprob_requested", "LOGPROB_REQUESTED")
IDS = ("logprob_token_ids", "LOGPROB_TOKEN_IDS")
COUNTS = ("logprob_token_id_counts", "LOGPROB_TOKEN_ID_COUNTS")


def records() -> BufferDeclaration:
    return BufferDeclaration("completion_records", "int64", (2, CAPACITY, 16 + T))


def packed(words: int = 258) -> BufferDeclaration:
    return BufferDeclaration("completion_logprobs", "int32", (2, CAPACITY, T, words))


def flags() -> BufferDeclaration:
    return BufferDeclaration("logprob_requested", "int32", (CAPACITY,))


def token_ids() -> BufferDeclaration:
    return BufferDeclaration("logprob_token_ids", "int32", (CAPACITY, 128))


def counts() -> BufferDeclaration:
    return BufferDeclaration("logprob_token_id_counts", "int32", (CAPACITY,))


def full_buffers() -> list[BufferDeclaration]:
    return [records(), packed(), flags(), token_ids(), counts()]


def graph(
    name: str, operation: str, *bindings: tuple[str, str], logprobs: bool = True
) -> GraphDeclaration:
    outputs = ("completion_records", "completion_logprobs") if logprobs else ("completion_records",)
    return GraphDeclaration(name, operation, (*ORDINARY, *bindings), outputs)


def full_graphs() -> list[GraphDeclaration]:
    return [
        graph("prefill", "PREFILL", FLAG, IDS, COUNTS),
        graph("decode", "DECODE", FLAG, IDS, COUNTS),
    ]


def natural_graphs() -> list[GraphDeclaration]:
    return [graph("prefill", "PREFILL", FLAG), graph("decode", "DECODE", FLAG)]


def plain_graphs() -> list[GraphDeclaration]:
    return [graph("prefill", "PREFILL", logprobs=False), graph("decode", "DECODE", logprobs=False)]


def capability(
    buffers: Iterable[BufferDeclaration], graphs: Iterable[GraphDeclaration]
) -> LogprobCapability:
    return validate_declarations(buffers, graphs, capacity=CAPACITY, token_capacity=T)


def fails_with(
    buffers: Iterable[BufferDeclaration], graphs: Iterable[GraphDeclaration], message: str
) -> None:
    with pytest.raises(CoreValidationError, match=re.escape(message)):
        capability(buffers, graphs)


def test_core_without_logprob_buffers_has_no_logprobs() -> None:
    result = capability([records()], plain_graphs())
    assert result == NO_LOGPROBS
    assert not result.enabled
    assert result.position_words == 0


def test_core_without_any_completion_buffer_has_no_logprobs() -> None:
    assert capability([], [GraphDeclaration("decode", "DECODE", ORDINARY)]) == NO_LOGPROBS


@pytest.mark.parametrize("top_k", [1, 5, 20])
def test_natural_core_serves_the_k_its_last_extent_declares(top_k: int) -> None:
    result = capability([records(), packed(2 + 2 * top_k), flags()], natural_graphs())
    assert result == LogprobCapability(top_k=top_k, selects_ids=False)
    assert result.enabled
    assert result.position_words == 2 + 2 * top_k


@pytest.mark.parametrize("words", [2, 3, 43, 44, 258])
def test_natural_core_outside_one_to_twenty_alternatives_fails(words: int) -> None:
    fails_with(
        [records(), packed(words), flags()],
        natural_graphs(),
        f"completion_logprobs: expected int32[2, {CAPACITY}, {T}, 2+2*K] with 1 <= K <= 20, "
        f"got int32[2, {CAPACITY}, {T}, {words}]",
    )


def test_full_core_has_twenty_alternatives_and_selected_ids() -> None:
    result = capability(full_buffers(), full_graphs())
    assert result == FULL_LOGPROBS == LogprobCapability(top_k=20, selects_ids=True)
    assert result.position_words == 258


def test_full_core_with_a_natural_last_extent_fails() -> None:
    buffers = [records(), packed(42), flags(), token_ids(), counts()]
    fails_with(
        buffers,
        full_graphs(),
        f"completion_logprobs: expected int32[2, {CAPACITY}, {T}, 258], "
        f"got int32[2, {CAPACITY}, {T}, 42]",
    )


def test_wrong_dtype_fails_naming_the_buffer() -> None:
    buffers = full_buffers()
    buffers[2] = BufferDeclaration("logprob_requested", "int64", (CAPACITY,))
    fails_with(
        buffers, full_graphs(), f"logprob_requested: expected int32[{CAPACITY}], got int64[16]"
    )


def test_records_with_the_wrong_dtype_fail() -> None:
    buffers = full_buffers()
    buffers[0] = BufferDeclaration("completion_records", "int32", (2, CAPACITY, 16 + T))
    fails_with(
        buffers,
        full_graphs(),
        f"completion_records: expected int64[2, {CAPACITY}, 24], got int32[2, {CAPACITY}, 24]",
    )


def test_wrong_frame_count_fails() -> None:
    buffers = full_buffers()
    buffers[1] = BufferDeclaration("completion_logprobs", "int32", (1, CAPACITY, T, 258))
    fails_with(
        buffers,
        full_graphs(),
        f"completion_logprobs: expected int32[2, {CAPACITY}, {T}, 258], "
        f"got int32[1, {CAPACITY}, {T}, 258]",
    )


def test_wrong_frame_count_of_a_natural_core_fails() -> None:
    buffers = [
        records(),
        BufferDeclaration("completion_logprobs", "int32", (3, 16, 8, 12)),
        flags(),
    ]
    fails_with(
        buffers,
        natural_graphs(),
        "completion_logprobs: expected int32[2, 16, 8, 2+2*K] with 1 <= K <= 20, "
        "got int32[3, 16, 8, 12]",
    )


def test_slot_extent_other_than_the_capacity_fails() -> None:
    buffers = full_buffers()
    buffers[3] = BufferDeclaration("logprob_token_ids", "int32", (8, 128))
    fails_with(
        buffers, full_graphs(), "logprob_token_ids: expected int32[16, 128], got int32[8, 128]"
    )


def test_records_sized_for_another_capacity_fail() -> None:
    with pytest.raises(CoreValidationError) as caught:
        validate_declarations(full_buffers(), full_graphs(), capacity=24, token_capacity=T)
    message = str(caught.value)
    assert "completion_records: expected int64[2, 24, 24], got int64[2, 16, 24]" in message
    assert "logprob_token_id_counts: expected int32[24], got int32[16]" in message


def test_token_capacity_other_than_t_fails_in_records_and_payload() -> None:
    with pytest.raises(CoreValidationError) as caught:
        validate_declarations(full_buffers(), full_graphs(), capacity=CAPACITY, token_capacity=4)
    message = str(caught.value)
    assert "completion_records: expected int64[2, 16, 20], got int64[2, 16, 24]" in message
    assert "completion_logprobs: expected int32[2, 16, 4, 258], got int32[2, 16, 8, 258]" in message


def test_ids_without_counts_fail() -> None:
    fails_with(
        [records(), packed(), flags(), token_ids()],
        full_graphs(),
        "logprob_token_id_counts: expected int32[16], missing "
        "(a core that declares logprob_token_ids must declare all five buffers)",
    )


def test_counts_without_ids_fail() -> None:
    fails_with(
        [records(), packed(), flags(), counts()],
        full_graphs(),
        "logprob_token_ids: expected int32[16, 128], missing",
    )


def test_id_inputs_without_the_payload_and_flags_fail() -> None:
    with pytest.raises(CoreValidationError) as caught:
        capability([records(), token_ids(), counts()], plain_graphs())
    message = str(caught.value)
    assert "completion_logprobs: expected int32[2, 16, 8, 258], missing" in message
    assert "logprob_requested: expected int32[16], missing" in message


def test_flags_without_completion_logprobs_fail() -> None:
    fails_with(
        [records(), flags()],
        natural_graphs(),
        "completion_logprobs: expected int32[2, 16, 8, 2+2*K] with 1 <= K <= 20, missing "
        "(required with logprob_requested)",
    )


def test_completion_logprobs_without_flags_fail() -> None:
    fails_with(
        [records(), packed(42)],
        [graph("decode", "DECODE")],
        "logprob_requested: expected int32[16], missing (required with completion_logprobs)",
    )


def test_logprob_buffers_without_records_fail() -> None:
    fails_with(
        [packed(42), flags()],
        natural_graphs(),
        "completion_records: expected int64[2, 16, 24], missing "
        "(required with completion_logprobs)",
    )


def test_records_alone_are_still_checked() -> None:
    fails_with(
        [BufferDeclaration("completion_records", "int64", (2, CAPACITY, 16))],
        plain_graphs(),
        "completion_records: expected int64[2, 16, 24], got int64[2, 16, 16]",
    )


@pytest.mark.parametrize("operation", ["DECODE", "MIXED", "VERIFY"])
def test_sampling_graph_without_the_flag_binding_fails(operation: str) -> None:
    graphs = [*natural_graphs(), GraphDeclaration("sampler", operation, ORDINARY)]
    fails_with(
        [records(), packed(12), flags()],
        graphs,
        "graph 'sampler': expected input binding logprob_requested <- LOGPROB_REQUESTED, missing",
    )


def test_graph_writing_logprobs_without_the_flag_binding_fails() -> None:
    graphs = [graph("prefill", "PREFILL"), graph("decode", "DECODE", FLAG)]
    fails_with(
        [records(), packed(12), flags()],
        graphs,
        "graph 'prefill': expected input binding logprob_requested <- LOGPROB_REQUESTED, missing",
    )


def test_prefill_graph_without_logprob_outputs_needs_no_flag() -> None:
    graphs = [graph("prefill", "PREFILL", logprobs=False), graph("decode", "DECODE", FLAG)]
    assert capability([records(), packed(12), flags()], graphs).top_k == 5


def test_sampling_graph_of_a_core_without_logprobs_needs_no_flag() -> None:
    assert capability([records()], [GraphDeclaration("decode", "DECODE", ORDINARY)]).top_k == 0


@pytest.mark.parametrize("missing", [IDS, COUNTS])
def test_sampling_graph_missing_an_id_binding_fails_when_ids_are_declared(
    missing: tuple[str, str],
) -> None:
    kept = [binding for binding in (FLAG, IDS, COUNTS) if binding != missing]
    graphs = [graph("prefill", "PREFILL", FLAG, IDS, COUNTS), graph("decode", "DECODE", *kept)]
    fails_with(
        full_buffers(),
        graphs,
        f"graph 'decode': expected input binding {missing[0]} <- {missing[1]}, missing",
    )


def test_flag_bound_to_the_wrong_source_fails() -> None:
    graphs = [graph("decode", "DECODE", ("logprob_requested", "LOGPROB_TOKEN_ID_COUNTS"))]
    fails_with(
        [records(), packed(12), flags()],
        graphs,
        "graph 'decode': expected input binding logprob_requested <- LOGPROB_REQUESTED, "
        "got logprob_requested <- LOGPROB_TOKEN_ID_COUNTS",
    )


def test_natural_core_binding_id_inputs_fails() -> None:
    graphs = [graph("decode", "DECODE", FLAG, IDS)]
    fails_with(
        [records(), packed(12), flags()],
        graphs,
        "graph 'decode': binds logprob_token_ids <- LOGPROB_TOKEN_IDS, "
        "but the core declares no logprob_token_ids buffer",
    )


def test_graph_output_that_is_not_a_declared_buffer_fails() -> None:
    fails_with(
        [records()],
        [graph("decode", "DECODE")],
        "graph 'decode': output 'completion_logprobs' is not a declared buffer",
    )


def test_graph_with_an_unspecified_operation_fails() -> None:
    fails_with(
        [records()],
        [GraphDeclaration("mystery", "OPERATION_UNSPECIFIED", ORDINARY)],
        "graph 'mystery': expected an operation in",
    )


def test_every_problem_is_reported_at_once() -> None:
    buffers = [records(), packed(7), BufferDeclaration("logprob_requested", "int64", (16,))]
    with pytest.raises(CoreValidationError) as caught:
        capability(buffers, [GraphDeclaration("decode", "DECODE", ORDINARY)])
    message = str(caught.value)
    assert "logprob_requested: expected int32[16], got int64[16]" in message
    assert "completion_logprobs: expected int32[2, 16, 8, 2+2*K]" in message
    assert "graph 'decode': expected input binding logprob_requested" in message


def test_validation_errors_are_value_errors() -> None:
    assert issubclass(CoreValidationError, ValueError)
