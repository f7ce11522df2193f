"""Prompt-scoring declarations validate into scored capacities, or fail naming what is wrong."""

from __future__ import annotations

import pytest

from domain.contract.capabilities import FULL_LOGPROBS, LogprobCapability, scored_capacities
from domain.contract.core_validation import CoreValidationError
from domain.contract.declarations import BufferDeclaration, GraphDeclaration
from tests.unit.domain.test_core_validation import (
    CAPACITY,
    COUNTS,
    FLAG,
    IDS,
    ORDINARY,
    T,
    capability,
    fails_with,
)

C = 512
TARGET = ("prompt_target_tokens", "PROMPT_TARGET_TOKEN")
GENERATION_OUTPUTS = ("completion_records", "completion_logprobs")
SCORED_OUTPUTS = (*GENERATION_OUTPUTS, "prompt_logprobs")


def full_bundle() -> list[BufferDeclaration]:
    return [
        BufferDeclaration("completion_records", "int64", (2, CAPACITY, 16 + T)),
        BufferDeclaration("completion_logprobs", "int32", (2, CAPACITY, T, 258)),
        BufferDeclaration("logprob_requested", "int32", (CAPACITY,)),
        BufferDeclaration("logprob_token_ids", "int32", (CAPACITY, 128)),
        BufferDeclaration("logprob_token_id_counts", "int32", (CAPACITY,)),
    ]


def natural_bundle(top_k: int) -> list[BufferDeclaration]:
    return [
        BufferDeclaration("completion_records", "int64", (2, CAPACITY, 16 + T)),
        BufferDeclaration("completion_logprobs", "int32", (2, CAPACITY, T, 2 + 2 * top_k)),
        BufferDeclaration("logprob_requested", "int32", (CAPACITY,)),
    ]


def prompt_rows(rows: int = C) -> BufferDeclaration:
    return BufferDeclaration("prompt_logprobs", "int32", (2, rows, 43))


def prompt_targets(rows: int = C) -> BufferDeclaration:
    return BufferDeclaration("prompt_target_tokens", "int32", (rows,))


def scored(
    capacity: int,
    *bindings: tuple[str, str],
    outputs: tuple[str, ...] = SCORED_OUTPUTS,
) -> GraphDeclaration:
    return GraphDeclaration(f"scored_prefill_{capacity}", "SCORED_PREFILL", bindings, outputs)


def sampler(name: str, operation: str, *bindings: tuple[str, str]) -> GraphDeclaration:
    return GraphDeclaration(name, operation, (*ORDINARY, *bindings), GENERATION_OUTPUTS)


def full_graphs(rows: int = C) -> list[GraphDeclaration]:
    logprob = (FLAG, IDS, COUNTS)
    return [
        sampler("prefill", "PREFILL", *logprob),
        sampler("decode", "DECODE", *logprob),
        *(scored(c, *ORDINARY, *logprob, TARGET) for c in scored_capacities(rows)),
    ]


def natural_graphs(rows: int = C) -> list[GraphDeclaration]:
    return [
        sampler("prefill", "PREFILL", FLAG),
        sampler("decode", "DECODE", FLAG),
        *(scored(c, *ORDINARY, FLAG, TARGET) for c in scored_capacities(rows)),
    ]


def test_scored_prefill_is_held_to_the_sampling_rules() -> None:
    assert scored(128).samples


def test_full_core_with_prompt_buffers_and_the_ladder_of_graphs_scores_prompts() -> None:
    result = capability([*full_bundle(), prompt_rows(), prompt_targets()], full_graphs())
    assert result == LogprobCapability(top_k=20, selects_ids=True, scored_capacities=(128, 512))


def test_natural_core_with_twenty_alternatives_scores_prompts() -> None:
    buffers = [*natural_bundle(20), prompt_rows(1000), prompt_targets(1000)]
    result = capability(buffers, natural_graphs(1000))
    assert (result.top_k, result.selects_ids) == (20, False)
    assert result.scored_capacities == (128, 512, 1000)


def test_chunk_limit_below_the_first_rung_needs_a_single_scored_graph() -> None:
    result = capability([*full_bundle(), prompt_rows(100), prompt_targets(100)], full_graphs(100))
    assert result.scored_capacities == (100,)


def test_core_without_prompt_buffers_or_scored_graphs_scores_no_prompts() -> None:
    result = capability(full_bundle(), full_graphs()[:2])
    assert result == FULL_LOGPROBS
    assert not result.scores_prompts


def test_prompt_logprobs_without_targets_fail() -> None:
    fails_with(
        [*full_bundle(), prompt_rows()],
        full_graphs(),
        "prompt_target_tokens: expected int32[512], missing (required with prompt_logprobs)",
    )


def test_targets_without_prompt_logprobs_fail() -> None:
    fails_with(
        [*full_bundle(), prompt_targets()],
        full_graphs(),
        "prompt_logprobs: expected int32[2, 512, 43], missing (required with prompt_target_tokens)",
    )


@pytest.mark.parametrize(
    ("buffer", "got"),
    [
        (BufferDeclaration("prompt_logprobs", "float32", (2, C, 43)), "float32[2, 512, 43]"),
        (BufferDeclaration("prompt_logprobs", "int32", (2, C, 42)), "int32[2, 512, 42]"),
        (BufferDeclaration("prompt_logprobs", "int32", (1, C, 43)), "int32[1, 512, 43]"),
    ],
)
def test_malformed_prompt_logprobs_fail_with_the_form_the_targets_imply(
    buffer: BufferDeclaration, got: str
) -> None:
    fails_with(
        [*full_bundle(), buffer, prompt_targets()],
        full_graphs(),
        f"prompt_logprobs: expected int32[2, 512, 43], got {got}",
    )


@pytest.mark.parametrize(
    ("buffer", "got"),
    [
        (BufferDeclaration("prompt_target_tokens", "int64", (C,)), "int64[512]"),
        (BufferDeclaration("prompt_target_tokens", "int32", (256,)), "int32[256]"),
        (BufferDeclaration("prompt_target_tokens", "int32", (2, C)), "int32[2, 512]"),
    ],
)
def test_malformed_targets_fail_with_the_form_prompt_logprobs_implies(
    buffer: BufferDeclaration, got: str
) -> None:
    fails_with(
        [*full_bundle(), prompt_rows(), buffer],
        full_graphs(),
        f"prompt_target_tokens: expected int32[512], got {got}",
    )


def test_prompt_buffers_without_any_valid_row_count_name_the_generic_forms() -> None:
    buffers = [
        *full_bundle(),
        BufferDeclaration("prompt_logprobs", "int32", (2, 0, 43)),
        BufferDeclaration("prompt_target_tokens", "float32", (C,)),
    ]
    with pytest.raises(CoreValidationError) as caught:
        capability(buffers, full_graphs())
    message = str(caught.value)
    assert "prompt_logprobs: expected int32[2, C, 43] with C >= 1, got int32[2, 0, 43]" in message
    assert "prompt_target_tokens: expected int32[C] with C >= 1, got float32[512]" in message


def test_prompt_buffers_without_scored_graphs_fail() -> None:
    fails_with(
        [*full_bundle(), prompt_rows(), prompt_targets()],
        full_graphs()[:2],
        "prompt_logprobs: expected 2 SCORED_PREFILL graphs for C=512 (capacities 128, 512), got 0",
    )


@pytest.mark.parametrize("rows", [128, 2048])
def test_scored_graphs_other_than_the_ladder_of_c_fail(rows: int) -> None:
    # The graphs follow the 512 ladder while the buffers declare another C.
    fails_with(
        [*full_bundle(), prompt_rows(rows), prompt_targets(rows)],
        full_graphs(C),
        f"prompt_logprobs: expected {len(scored_capacities(rows))} SCORED_PREFILL graphs "
        f"for C={rows} (capacities {', '.join(map(str, scored_capacities(rows)))}), got 2",
    )


def test_scored_graphs_without_prompt_buffers_fail() -> None:
    with pytest.raises(CoreValidationError) as caught:
        capability(full_bundle(), full_graphs())
    message = str(caught.value)
    assert (
        "graph 'scored_prefill_128': a SCORED_PREFILL graph needs the prompt_logprobs and "
        "prompt_target_tokens buffers, which the core does not declare" in message
    )
    assert (
        "graph 'scored_prefill_512': output 'prompt_logprobs' is not a declared buffer" in message
    )


@pytest.mark.parametrize("top_k", [1, 5, 19])
def test_scoring_in_a_natural_core_with_fewer_than_twenty_alternatives_fails(top_k: int) -> None:
    fails_with(
        [*natural_bundle(top_k), prompt_rows(), prompt_targets()],
        natural_graphs(),
        "prompt_logprobs: prompt scoring requires K=20 generation logprob outputs "
        f"(completion_logprobs with last extent 42, or the full bundle), got K={top_k}",
    )


def test_scoring_in_a_core_without_generation_logprobs_fails() -> None:
    records = BufferDeclaration("completion_records", "int64", (2, CAPACITY, 16 + T))
    graphs = [
        GraphDeclaration("prefill", "PREFILL", ORDINARY, ("completion_records",)),
        *(
            scored(c, *ORDINARY, TARGET, outputs=("completion_records", "prompt_logprobs"))
            for c in (128, 512)
        ),
    ]
    fails_with(
        [records, prompt_rows(), prompt_targets()],
        graphs,
        "prompt_logprobs: prompt scoring requires K=20 generation logprob outputs "
        "(completion_logprobs with last extent 42, or the full bundle), got none",
    )


def test_scored_graph_without_the_target_binding_fails() -> None:
    graphs = full_graphs()
    graphs[2] = scored(128, *ORDINARY, FLAG, IDS, COUNTS)
    fails_with(
        [*full_bundle(), prompt_rows(), prompt_targets()],
        graphs,
        "graph 'scored_prefill_128': expected input binding prompt_target_tokens <- "
        "PROMPT_TARGET_TOKEN, missing (SCORED_PREFILL graphs bind it)",
    )


@pytest.mark.parametrize(
    "binding",
    [("prompt_target_tokens", "INPUT_TOKENS"), ("targets", "PROMPT_TARGET_TOKEN")],
)
def test_scored_graph_binding_the_target_under_another_name_or_source_fails(
    binding: tuple[str, str],
) -> None:
    graphs = full_graphs()
    graphs[3] = scored(512, *ORDINARY, FLAG, IDS, COUNTS, binding)
    fails_with(
        [*full_bundle(), prompt_rows(), prompt_targets()],
        graphs,
        "graph 'scored_prefill_512': expected input binding prompt_target_tokens <- "
        f"PROMPT_TARGET_TOKEN, got {binding[0]} <- {binding[1]}",
    )


def test_scored_graph_without_the_prompt_logprobs_output_fails() -> None:
    graphs = full_graphs()
    graphs[2] = scored(128, *ORDINARY, FLAG, IDS, COUNTS, TARGET, outputs=GENERATION_OUTPUTS)
    fails_with(
        [*full_bundle(), prompt_rows(), prompt_targets()],
        graphs,
        "graph 'scored_prefill_128': expected output prompt_logprobs, missing "
        "(SCORED_PREFILL graphs write it)",
    )


def test_scored_graph_without_the_logprob_inputs_fails_like_any_sampling_graph() -> None:
    graphs = full_graphs()
    graphs[2] = scored(128, *ORDINARY, FLAG, TARGET)
    fails_with(
        [*full_bundle(), prompt_rows(), prompt_targets()],
        graphs,
        "graph 'scored_prefill_128': expected input binding logprob_token_ids <- "
        "LOGPROB_TOKEN_IDS, missing",
    )


@pytest.mark.parametrize("operation", ["PREFILL", "DECODE", "MIXED", "VERIFY"])
def test_other_operations_binding_prompt_targets_fail(operation: str) -> None:
    graphs = [*full_graphs(), sampler("other", operation, FLAG, IDS, COUNTS, TARGET)]
    fails_with(
        [*full_bundle(), prompt_rows(), prompt_targets()],
        graphs,
        "graph 'other': binds prompt_target_tokens <- PROMPT_TARGET_TOKEN, "
        "but only SCORED_PREFILL graphs read prompt targets",
    )


def test_other_operation_binding_the_target_source_under_another_name_fails() -> None:
    graphs = full_graphs()
    graphs[0] = sampler("prefill", "PREFILL", FLAG, IDS, COUNTS, ("next", "PROMPT_TARGET_TOKEN"))
    fails_with(
        [*full_bundle(), prompt_rows(), prompt_targets()],
        graphs,
        "graph 'prefill': binds prompt_target_tokens <- PROMPT_TARGET_TOKEN, but only",
    )


def test_other_operation_writing_prompt_logprobs_fails() -> None:
    graphs = full_graphs()
    graphs[1] = GraphDeclaration("decode", "DECODE", (*ORDINARY, FLAG, IDS, COUNTS), SCORED_OUTPUTS)
    fails_with(
        [*full_bundle(), prompt_rows(), prompt_targets()],
        graphs,
        "graph 'decode': outputs prompt_logprobs, but only SCORED_PREFILL graphs write it",
    )


def test_every_scoring_problem_is_reported_at_once() -> None:
    graphs = [*full_graphs()[:2], scored(128, *ORDINARY, FLAG, IDS, COUNTS)]
    with pytest.raises(CoreValidationError) as caught:
        capability([*full_bundle(), prompt_rows()], graphs)
    message = str(caught.value)
    assert "prompt_target_tokens: expected int32[512], missing" in message
    assert "expected 2 SCORED_PREFILL graphs for C=512" in message
    assert "graph 'scored_prefill_128': expected input binding prompt_target_tokens" in message
