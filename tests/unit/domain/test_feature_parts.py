"""Each feature's per-request state is one part of its own package, valid on construction."""

from __future__ import annotations

import dataclasses
import json

import pytest

from domain.engine.scheduler import Scheduler, SchedulerConfig
from domain.engine.sequence import Sequence
from domain.engine.step import SlotWork
from domain.logprobs.scoring import PromptScoring
from domain.logprobs.values import NO_TOKEN
from domain.overlap.pending import feeding
from domain.requests.choice_sampling import ChoiceSampling, LaneSampling
from domain.requests.sampling import SamplingParams
from domain.speculation.choice import ChoiceSpeculation, DraftLane, Proposal
from domain.speculation.drafts import SpeculativeConfig, SpeculativeMethod
from domain.structured.constraint import GrammarLane, OutputConstraint
from domain.structured.grammar import GrammarKind, GrammarSpec
from tests.support.lanes import lane

CHOICE = GrammarSpec(GrammarKind.CHOICE, json.dumps(["abc"]))
DRAFT = SpeculativeConfig(SpeculativeMethod.DRAFT_MODEL, 3, model="draft")
NGRAM = SpeculativeConfig(SpeculativeMethod.NGRAM, 3, 1, 2)


def test_a_lane_proposing_drafts_has_none_yet_and_feeds_its_draft_model():
    with pytest.raises(ValueError, match="proposing"):
        DraftLane(drafts=(3,), propose=2, draft_feed=(7,), draft_start=5)
    with pytest.raises(ValueError, match="proposing"):
        DraftLane(propose=2)


def test_the_draft_model_catches_up_to_the_lanes_last_fed_token():
    with pytest.raises(ValueError, match="catches up"):
        lane(speculation=DraftLane(propose=2, draft_feed=(7,), draft_start=3))
    assert lane(speculation=DraftLane(propose=2, draft_feed=(6, 7), draft_start=4)).drafts == ()


def test_a_lane_whose_grammar_starts_in_the_prompt_is_refused():
    with pytest.raises(ValueError, match="generated position"):
        lane(grammar=GrammarLane(CHOICE, 3))


def test_a_forced_token_lane_neither_speculates_nor_is_constrained():
    with pytest.raises(ValueError, match="forced"):
        lane(forced_token=9, speculation=DraftLane())
    with pytest.raises(ValueError, match="forced"):
        lane(forced_token=9, grammar=GrammarLane(CHOICE, 4))
    assert lane(forced_token=9).forced_token == 9


def test_a_lane_samples_with_a_remaining_budget_of_at_least_one_token():
    with pytest.raises(ValueError, match="remaining"):
        LaneSampling(SamplingParams(), 0, remaining=0)


def test_the_output_constraint_starts_only_once_the_answer_has_begun():
    constraint = OutputConstraint(CHOICE)

    assert constraint.lane(4, None) is None
    assert constraint.lane(4, 3) == GrammarLane(CHOICE, 7)


def test_prompt_scoring_targets_skip_the_rows_published_before_a_preemption():
    scoring = PromptScoring((10, 11, 12, 13))
    scoring.scored_rows = 2

    assert scoring.targets(0, 4) == (NO_TOKEN, NO_TOKEN, 13, NO_TOKEN)
    assert scoring.pending


def test_draft_model_speculation_keeps_its_cache_in_step_with_what_stood():
    speculation = ChoiceSpeculation(DRAFT)

    assert speculation.propose(lambda: (1, 2), cap=2) == Proposal(propose=2)
    speculation.verified(offered=2, accepted=1, first_position=10)
    assert speculation.draft_computed == 11
    assert speculation.propose(lambda: (1, 2), cap=5) == Proposal(propose=2)
    speculation.preempted()
    assert speculation.draft_computed == 0


def test_history_speculation_builds_its_proposer_once_and_follows_the_outputs():
    speculation = ChoiceSpeculation(NGRAM)

    assert speculation.propose(lambda: (1, 2, 1), cap=3) == Proposal(drafts=(2, 1))
    speculation.observe((2,))
    assert speculation.propose(lambda: (), cap=1) == Proposal(drafts=(1,))
    assert speculation.propose(lambda: (), cap=0) == Proposal()


def test_a_plain_choice_plans_lanes_without_any_feature_part():
    scheduler = Scheduler(
        SchedulerConfig(
            max_num_seqs=2, max_num_batched_tokens=16, block_size=4, num_blocks=8, max_model_len=16
        )
    )
    sampling = ChoiceSampling(SamplingParams(max_tokens=4), 3, 4)
    scheduler.add(Sequence("plain", 0, (1, 2, 3), sampling))

    (work,) = scheduler.schedule().works

    assert (work.speculation, work.grammar, work.forced_token, work.prompt_targets) == (
        None,
        None,
        None,
        (),
    )
    assert work.sampling == LaneSampling(SamplingParams(max_tokens=4), 3, remaining=4)


def test_each_sequence_has_a_place_in_the_cache_of_its_own():
    first, second = (
        Sequence(name, 0, (1,), ChoiceSampling(SamplingParams(), 0, 1)) for name in "ab"
    )

    first.cache.blocks.append(3)

    assert second.cache.blocks == [] and first.cache.slot is None


def test_drafts_planned_for_a_lane_that_does_not_verify_are_refused_not_fed():
    from domain.engine.scheduler import _work

    sequence = Sequence("plain", 0, (1, 2, 3), ChoiceSampling(SamplingParams(max_tokens=4), 3, 4))
    sequence.cache.slot, sequence.cache.num_computed = 0, 2

    with pytest.raises(ValueError, match="does not verify"):
        _work(sequence, 1, False, Proposal(drafts=(5, 6)))


def test_a_lane_feeding_other_tokens_keeps_every_other_field():
    # Every field set away from its default, so a field `feeding` forgot would show.
    work = lane(
        token_ids=(7, 8),
        prompt_targets=(8, 9),
        grammar=GrammarLane(CHOICE, 5),
    )
    fed = feeding(work, (11, 12))
    assert fed == dataclasses.replace(work, token_ids=(11, 12))
    assert feeding(lane(forced_token=4), (9,)) == lane(forced_token=4, token_ids=(9,))
    speculating = lane(token_ids=(7, 3), speculation=DraftLane(drafts=(3,)))
    assert feeding(speculating, (7, 3)) == speculating
    # A new SlotWork field must be set away from its default above, and named here.
    assert [f.name for f in dataclasses.fields(SlotWork)] == [
        "slot", "epoch", "token_ids", "start_position", "block_table", "prompt_len",
        "sample", "sampling", "prompt_targets", "speculation", "grammar", "forced_token",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="at least one token"):
        feeding(work, ())


def test_a_fill_in_that_would_break_a_lanes_checks_is_refused():
    # Only a lane without drafts fed as many tokens skips the checks; every other fill-in
    # goes through them, so a lane feeding what its parts contradict is never built.
    speculating = lane(token_ids=(7, 3), speculation=DraftLane(drafts=(3,)))
    with pytest.raises(ValueError, match="drafts are the last fed tokens"):
        feeding(speculating, (7, 4))
    with pytest.raises(ValueError, match="prompt targets"):
        feeding(lane(token_ids=(7, 8), prompt_targets=(8, 9)), (11,))
