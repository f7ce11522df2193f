"""The domain buffer table is the contract's: every buffer once, with its dtype, shape and role."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from domain.contract.buffers import (
    CONTRACT_BUFFERS,
    GENERATION_GROUPS,
    BufferGroup,
    buffers_in,
    contract_buffer,
    input_sources,
)
from domain.contract.declarations import VALUE_SOURCES, describe_form

CONTRACT = Path(__file__).resolve().parents[3] / "contracts" / "buffers.md"
# A buffer row of the contract's tables: | `name` | dtype | [extents] | meaning |
ROW = re.compile(r"^\| `(\w+)` \| (\w+) \| \[([^\]]*)\] \| (.*) \|$", re.MULTILINE)
SIZES = [
    {"capacity": 16, "T": 8, "C": 512},
    {"capacity": 8, "T": 4, "C": 100},
    {"capacity": 24, "T": 1, "C": 2048},
]


def contract_rows() -> list[tuple[str, str, str, str]]:
    return ROW.findall(CONTRACT.read_text(encoding="utf-8"))


def evaluate(extent: str, sizes: dict[str, int]) -> int:
    """An extent of the contract's tables, such as `16+T`, at the given sizes."""
    return sum(
        math.prod(int(factor) if factor.isdigit() else sizes[factor] for factor in term.split("*"))
        for term in extent.split("+")
    )


def test_the_contract_tables_list_seven_buffers() -> None:
    assert [name for name, *_ in contract_rows()] == [
        "completion_records",
        "completion_logprobs",
        "logprob_requested",
        "logprob_token_ids",
        "logprob_token_id_counts",
        "prompt_target_tokens",
        "prompt_logprobs",
    ]


def test_every_contract_buffer_is_one_row_of_the_domain_table_and_nothing_else_is() -> None:
    names = [buffer.name for buffer in CONTRACT_BUFFERS]

    assert len(names) == len(set(names))
    assert sorted(names) == sorted(name for name, *_ in contract_rows())


@pytest.mark.parametrize("sizes", SIZES)
def test_every_row_has_the_contracts_dtype_and_shape_at_any_sizes(sizes: dict[str, int]) -> None:
    for name, dtype, extents, _ in contract_rows():
        expected = tuple(evaluate(extent.strip(), sizes) for extent in extents.split(","))

        form = contract_buffer(name).form(sizes["capacity"], sizes["T"], sizes["C"])

        assert form == (dtype, expected), name


def test_a_symbolic_chunk_limit_spells_the_contracts_prompt_forms() -> None:
    spelled = {
        name: describe_form(dtype, [extent.strip() for extent in extents.split(",")])
        for name, dtype, extents, _ in contract_rows()
    }
    for buffer in buffers_in(BufferGroup.PROMPT_SCORING):
        assert describe_form(*buffer.form(16, 8, "C")) == spelled[buffer.name]


def test_the_full_bundle_is_the_five_generation_buffers_in_contract_order() -> None:
    completion = [name for name, *_ in contract_rows()][:5]

    assert [buffer.name for buffer in buffers_in(*GENERATION_GROUPS)] == completion
    assert [buffer.name for buffer in buffers_in(BufferGroup.RECORDS)] == ["completion_records"]
    assert [buffer.name for buffer in buffers_in(BufferGroup.SELECTED_IDS)] == [
        "logprob_token_ids",
        "logprob_token_id_counts",
    ]


def test_inputs_are_bound_under_their_own_name_to_a_value_source_core_proto_defines() -> None:
    assert input_sources(*BufferGroup) == {
        "logprob_requested": "LOGPROB_REQUESTED",
        "logprob_token_ids": "LOGPROB_TOKEN_IDS",
        "logprob_token_id_counts": "LOGPROB_TOKEN_ID_COUNTS",
        "prompt_target_tokens": "PROMPT_TARGET_TOKEN",
    }
    assert set(input_sources(*BufferGroup).values()) <= VALUE_SOURCES


def test_outputs_are_the_buffers_without_a_source_as_the_prompt_table_says() -> None:
    outputs = [buffer.name for buffer in CONTRACT_BUFFERS if buffer.source is None]

    assert outputs == ["completion_records", "completion_logprobs", "prompt_logprobs"]
    for name, _, _, meaning in contract_rows():
        if meaning.startswith(("input:", "output:")):
            assert meaning.startswith("output:") == (name in outputs), name


def test_an_unknown_buffer_has_no_row() -> None:
    with pytest.raises(KeyError):
        contract_buffer("completion_scores")
