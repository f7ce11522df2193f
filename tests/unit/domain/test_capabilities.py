"""The logprob capability value, the rules it keeps, and the buffers it declares."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from domain.contract.buffers import CONTRACT_BUFFERS, BufferGroup, contract_buffer
from domain.contract.capabilities import (
    FULL_LOGPROBS,
    NO_LOGPROBS,
    LogprobCapability,
    ladder_problem,
    natural_top_k_problem,
    scored_capacities,
    scoring_problem,
    selected_ids_problem,
)
from domain.logprobs.rules import LogprobLimits

SCORING = LogprobCapability(top_k=20, selects_ids=True, scored_capacities=(128, 512))


@pytest.mark.parametrize(
    ("limit", "ladder"),
    [
        (512, (128, 512)),
        (2048, (128, 512, 2048)),
        (1000, (128, 512, 1000)),
        (100, (100,)),
        (128, (128,)),
        (129, (128, 129)),
        (1, (1,)),
        (8192, (128, 512, 2048, 8192)),
    ],
)
def test_scored_capacities_grow_fourfold_from_128_and_end_at_the_chunk_limit(
    limit: int, ladder: tuple[int, ...]
) -> None:
    assert scored_capacities(limit) == ladder


def test_every_ladder_ascends_by_four_below_its_limit_and_ends_there() -> None:
    for limit in range(1, 5000):
        ladder = scored_capacities(limit)
        assert ladder[-1] == limit
        below = ladder[:-1]
        assert all(c < limit for c in below)
        assert list(below) == [128 * 4**index for index in range(len(below))]
        # The next rung would reach the limit, so the ladder is as long as it may be.
        assert (128 * 4 ** len(below)) >= limit


@pytest.mark.parametrize("limit", [0, -1, -512, True, 2.5])
def test_scored_capacities_refuse_a_limit_that_is_not_a_positive_integer(limit: object) -> None:
    with pytest.raises(ValueError, match="chunk limit"):
        scored_capacities(limit)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("top_k", "selects_ids"), [(-1, False), (21, False), (0, True), (5, True), (19, True)]
)
def test_capability_outside_the_contract_is_rejected(top_k: int, selects_ids: bool) -> None:
    with pytest.raises(ValueError):
        LogprobCapability(top_k=top_k, selects_ids=selects_ids)


def test_capabilities_without_scoring_score_no_prompts() -> None:
    for plain in (NO_LOGPROBS, FULL_LOGPROBS, LogprobCapability(top_k=5, selects_ids=False)):
        assert plain.scored_capacities == ()
        assert not plain.scores_prompts
        assert plain.scored_rows == 0


def test_capability_with_a_ladder_scores_prompts_up_to_its_largest_capacity() -> None:
    scoring = LogprobCapability(top_k=20, selects_ids=True, scored_capacities=[128, 512, 1000])
    assert scoring.scored_capacities == (128, 512, 1000)
    assert scoring.scores_prompts
    assert scoring.scored_rows == 1000
    assert scoring != FULL_LOGPROBS


@pytest.mark.parametrize("capacities", [(512,), (128, 1024), (512, 128), (0,), (128, 128, 512)])
def test_capability_refuses_capacities_that_are_not_the_ladder_of_their_largest(
    capacities: tuple[int, ...],
) -> None:
    with pytest.raises(ValueError, match="scored capacities"):
        LogprobCapability(top_k=20, selects_ids=True, scored_capacities=capacities)


@pytest.mark.parametrize("top_k", [0, 1, 19])
def test_capability_refuses_scoring_without_twenty_alternatives(top_k: int) -> None:
    with pytest.raises(ValueError, match="K=20"):
        LogprobCapability(top_k=top_k, selects_ids=False, scored_capacities=(128,))


@pytest.mark.parametrize(
    ("problem", "value", "expected"),
    [
        (natural_top_k_problem, 1, None),
        (natural_top_k_problem, 20, None),
        (natural_top_k_problem, 0, "natural cores need 1 <= top_k <= 20, got 0"),
        (natural_top_k_problem, 21, "natural cores need 1 <= top_k <= 20, got 21"),
        (selected_ids_problem, 20, None),
        (selected_ids_problem, 5, "full cores provide K=20 natural alternatives, not 5"),
        (scoring_problem, 20, None),
        (
            scoring_problem,
            0,
            "prompt scoring requires K=20 generation logprob outputs "
            "(completion_logprobs with last extent 42, or the full bundle), got none",
        ),
        (
            scoring_problem,
            19,
            "prompt scoring requires K=20 generation logprob outputs "
            "(completion_logprobs with last extent 42, or the full bundle), got K=19",
        ),
        (ladder_problem, (128, 512, 1000), None),
        (ladder_problem, (0,), "scored capacities must be positive integers, got (0,)"),
        (
            ladder_problem,
            (512,),
            "scored capacities must be the ladder (128, 512) of their largest, got (512,)",
        ),
    ],
)
def test_each_rule_states_what_it_expects_and_what_it_got(
    problem: Callable[[Any], str | None], value: object, expected: str | None
) -> None:
    assert problem(value) == expected


@pytest.mark.parametrize(
    ("top_k", "selects_ids", "capacities", "rule"),
    [
        (21, False, (), lambda: natural_top_k_problem(21)),
        (5, True, (), lambda: selected_ids_problem(5)),
        (0, True, (), lambda: selected_ids_problem(0)),
        (20, True, (512,), lambda: ladder_problem((512,))),
        (5, False, (128,), lambda: scoring_problem(5)),
    ],
)
def test_the_capability_refuses_with_the_sentence_of_the_rule_it_breaks(
    top_k: int, selects_ids: bool, capacities: tuple[int, ...], rule: Callable[[], str | None]
) -> None:
    with pytest.raises(ValueError) as caught:
        LogprobCapability(top_k=top_k, selects_ids=selects_ids, scored_capacities=capacities)

    assert str(caught.value) == rule()


@pytest.mark.parametrize(
    ("capability", "groups"),
    [
        (NO_LOGPROBS, [BufferGroup.RECORDS]),
        (LogprobCapability(top_k=5, selects_ids=False), [BufferGroup.RECORDS, BufferGroup.NATURAL]),
        (FULL_LOGPROBS, [BufferGroup.RECORDS, BufferGroup.NATURAL, BufferGroup.SELECTED_IDS]),
        (SCORING, list(BufferGroup)),
    ],
)
def test_a_capability_declares_the_records_and_the_groups_its_outputs_need(
    capability: LogprobCapability, groups: list[BufferGroup]
) -> None:
    assert list(capability.groups) == groups
    assert [buffer.name for buffer in capability.buffers] == [
        buffer.name for buffer in CONTRACT_BUFFERS if buffer.group in groups
    ]


def test_a_scoring_capability_keeps_its_prompt_group_out_of_its_generation_groups() -> None:
    assert BufferGroup.PROMPT_SCORING not in SCORING.generation_groups
    assert (*SCORING.generation_groups, BufferGroup.PROMPT_SCORING) == SCORING.groups


def test_a_full_capability_declares_every_buffer_at_its_table_form() -> None:
    for buffer in SCORING.buffers:
        assert SCORING.form(buffer, 16, 8) == buffer.form(16, 8, 512)


@pytest.mark.parametrize("top_k", [1, 5, 20])
def test_a_natural_capability_packs_two_plus_two_k_words_per_position(top_k: int) -> None:
    natural = LogprobCapability(top_k=top_k, selects_ids=False)

    form = natural.form(contract_buffer("completion_logprobs"), 16, 8)

    assert form == ("int32", (2, 16, 8, 2 + 2 * top_k))


def test_request_limits_take_the_capabilitys_k_ids_and_scoring_with_the_server_limits() -> None:
    natural = LogprobCapability(top_k=5, selects_ids=False)

    assert SCORING.limits(max_logprobs=3, vocab_size=50) == LogprobLimits(
        top_k=20, selects_ids=True, scores_prompts=True, max_logprobs=3, vocab_size=50
    )
    assert natural.limits(max_logprobs=20, vocab_size=64) == LogprobLimits(
        top_k=5, selects_ids=False, scores_prompts=False, max_logprobs=20, vocab_size=64
    )
