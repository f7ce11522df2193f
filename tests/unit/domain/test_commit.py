"""The shared commit rule: what a verification round emits, and how many drafts it kept."""

from __future__ import annotations

import pytest

from domain.contract.records import Finish
from domain.engine.commit import commit_round
from domain.engine.step import SlotWork
from domain.requests.choice_sampling import LaneSampling
from domain.requests.sampling import SamplingParams
from domain.speculation.choice import DraftLane

STOP = 7


def verifying(drafts: tuple[int, ...], remaining: int) -> SlotWork:
    """A speculative lane feeding its last token and then `drafts`, with STOP as stop token."""
    return SlotWork(
        slot=0,
        epoch=1,
        token_ids=(3, *drafts),
        start_position=10,
        block_table=(0,),
        prompt_len=4,
        sample=True,
        sampling=LaneSampling(
            SamplingParams(max_tokens=64), 0, stop_token_ids=frozenset({STOP}), remaining=remaining
        ),
        speculation=DraftLane(drafts=drafts),
    )


def test_a_round_that_is_not_clipped_keeps_every_accepted_draft():
    # Drafts 4, 5 stood; the target chose 9 over draft 6 (the correction).
    work = verifying((4, 5, 6), remaining=10)

    assert commit_round(work, (4, 5, 9), accepted=2) == ((4, 5, 9), Finish.NONE, 2)


def test_a_fully_accepted_round_keeps_its_drafts_and_emits_the_bonus():
    work = verifying((4, 5, 6), remaining=10)

    assert commit_round(work, (4, 5, 6, 8), accepted=3) == ((4, 5, 6, 8), Finish.NONE, 3)


def test_a_stop_token_inside_an_accepted_run_keeps_only_the_drafts_it_emits():
    # Every draft stood, but the second is the stop token: drafts 3 and the bonus never show.
    work = verifying((4, STOP, 6), remaining=10)

    assert commit_round(work, (4, STOP, 6, 8), accepted=3) == ((4, STOP), Finish.STOP_TOKEN, 2)


def test_the_length_limit_inside_an_accepted_run_keeps_only_the_drafts_it_emits():
    work = verifying((4, 5, 6), remaining=2)

    assert commit_round(work, (4, 5, 6, 8), accepted=3) == ((4, 5), Finish.LENGTH, 2)


def test_a_limit_that_clips_only_the_bonus_keeps_every_accepted_draft():
    work = verifying((4, 5, 6), remaining=3)

    assert commit_round(work, (4, 5, 6, 8), accepted=3) == ((4, 5, 6), Finish.LENGTH, 3)


def test_a_plain_sampling_round_has_no_drafts_to_keep():
    work = verifying((), remaining=1)

    assert commit_round(work, (STOP,)) == ((STOP,), Finish.STOP_TOKEN, 0)


@pytest.mark.parametrize("accepted", [-1, 4])
def test_more_accepted_drafts_than_the_round_sampled_before_its_last_token_is_refused(accepted):
    work = verifying((4, 5, 6), remaining=10)

    with pytest.raises(ValueError, match="accepted"):
        commit_round(work, (4, 5, 6, 8), accepted=accepted)
