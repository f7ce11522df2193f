"""Which submissions an executor may commit after it launched the next, and what they feed."""

from __future__ import annotations

import json

import pytest

from domain.contract.records import CompletionRecord, Finish, Role
from domain.engine.step import StepPlan
from domain.overlap.late_commit import commits_late, drawn_tokens
from domain.overlap.pending import PENDING_TOKEN, last_tokens, resolve_pending
from domain.speculation.choice import DraftLane
from domain.structured.constraint import GrammarLane
from domain.structured.grammar import GrammarKind, GrammarSpec
from tests.support.lanes import lane

CHOICE = GrammarSpec(GrammarKind.CHOICE, json.dumps(["abc"]))


def test_a_plan_of_plain_sampling_and_prompt_lanes_commits_late():
    prompt_only = lane(slot=1, token_ids=(3, 4, 5), start_position=0, prompt_len=3, sample=False)

    assert commits_late(StepPlan((lane(slot=0), prompt_only)))


@pytest.mark.parametrize(
    "part",
    [
        {"speculation": DraftLane(drafts=(9,)), "token_ids": (7, 9)},
        {"grammar": GrammarLane(CHOICE, 5)},
        {"forced_token": 11},
    ],
    ids=["drafts", "grammar", "forced token"],
)
def test_one_lane_whose_record_the_commit_decides_keeps_the_whole_plan_in_turn(part):
    assert not commits_late(StepPlan((lane(slot=0), lane(slot=1, **part))))


def test_a_scored_plan_commits_in_turn():
    scored = lane(slot=0, token_ids=(3, 4), start_position=0, prompt_len=2, prompt_targets=(4, -1))

    assert not commits_late(StepPlan((scored,), scored=True))


def test_drawn_tokens_feed_the_next_plan_as_the_records_would():
    plan = StepPlan(
        (
            lane(slot=0),
            lane(slot=1, token_ids=(3, 4), start_position=0, prompt_len=2, sample=False),
            lane(slot=2),
        )
    )
    records = (
        CompletionRecord(0, 1, Role.SAMPLE, (21,), 5),
        CompletionRecord(1, 1, Role.PROMPT),
        CompletionRecord(2, 1, Role.SAMPLE, (2,), 5, finish=Finish.STOP_TOKEN),
    )
    ahead = StepPlan(
        tuple(lane(slot=slot, token_ids=(PENDING_TOKEN,), start_position=6) for slot in (0, 1, 2))
    )

    drawn = drawn_tokens(plan, [21, 2])

    assert drawn == last_tokens(records) == {(0, 1): 21, (2, 1): 2}
    assert resolve_pending(ahead, drawn) == resolve_pending(ahead, last_tokens(records))
    assert [w.token_ids for w in resolve_pending(ahead, drawn).works] == [(21,), (0,), (2,)]


def test_drawn_tokens_are_refused_for_a_plan_that_commits_in_turn():
    with pytest.raises(ValueError, match="commits late"):
        drawn_tokens(StepPlan((lane(slot=0, forced_token=11),)), [11])
    with pytest.raises(ValueError):
        drawn_tokens(StepPlan((lane(slot=0), lane(slot=1))), [5])
