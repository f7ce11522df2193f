"""Buffer and graph declarations are valid values from the moment they exist."""

from __future__ import annotations

import pytest

from domain.contract.declarations import (
    SAMPLING_OPERATIONS,
    BufferDeclaration,
    GraphDeclaration,
    describe_form,
)


def test_declarations_reject_malformed_values() -> None:
    with pytest.raises(ValueError, match="extents"):
        BufferDeclaration("completion_records", "int64", (2, -1, 24))
    with pytest.raises(ValueError, match="name"):
        BufferDeclaration("", "int64", (2,))
    with pytest.raises(ValueError, match="bindings"):
        GraphDeclaration("decode", "DECODE", (("input_tokens",),))


def test_declarations_store_shapes_and_bindings_as_tuples() -> None:
    buffer = BufferDeclaration("logprob_requested", "int32", [16])
    declared = GraphDeclaration("decode", "DECODE", [["input_tokens", "INPUT_TOKENS"]], ["x"])
    assert buffer.shape == (16,)
    assert buffer.form == "int32[16]"
    assert declared.inputs == (("input_tokens", "INPUT_TOKENS"),)
    assert declared.outputs == ("x",)


def test_forms_are_spelled_as_dtype_and_bracketed_extents() -> None:
    assert describe_form("int32", (2, "C", 43)) == "int32[2, C, 43]"


@pytest.mark.parametrize("operation", ["DECODE", "MIXED", "VERIFY", "SCORED_PREFILL"])
def test_graphs_of_the_sampling_operations_sample(operation: str) -> None:
    assert GraphDeclaration("g", operation).samples
    assert operation in SAMPLING_OPERATIONS


def test_a_prefill_graph_does_not_count_as_sampling() -> None:
    assert not GraphDeclaration("prefill", "PREFILL").samples
