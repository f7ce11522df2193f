"""The speculative verdict: drafts stand up to the first rejection, then the target's token."""

from __future__ import annotations

import pytest

from domain.speculation.verdict import Verdict, speculative_verdict


def test_a_fully_kept_run_emits_every_draft_and_the_bonus():
    verdict = speculative_verdict((4, 5), [(True, 4), (True, 5), (False, 9)])

    assert verdict == Verdict((4, 5, 9), 2)


def test_the_first_rejection_emits_its_rows_own_token_and_nothing_after():
    verdict = speculative_verdict((4, 5, 6), [(True, 4), (False, 8), (True, 6), (True, 7)])

    assert verdict == Verdict((4, 8), 1)


def test_a_rejected_first_draft_emits_only_the_correction():
    assert speculative_verdict((4,), [(False, 2), (True, 3)]) == Verdict((2,), 0)


def test_a_round_without_drafts_emits_its_one_row():
    assert speculative_verdict((), [(False, 11)]) == Verdict((11,), 0)


def test_a_row_keeps_its_draft_even_when_its_own_token_differs():
    # Rejection sampling keeps a draft by its probabilities; the row's own token is then unused.
    assert speculative_verdict((4,), [(True, 30), (False, 9)]) == Verdict((4, 9), 1)


def test_rows_are_read_only_up_to_the_first_rejection():
    read: list[int] = []

    def rows():
        for index, row in enumerate([(True, 4), (False, 8), (True, 6), (True, 7)]):
            read.append(index)
            yield row

    speculative_verdict((4, 5, 6), rows())

    assert read == [0, 1]


def test_a_round_with_too_few_rows_is_an_error():
    with pytest.raises(ValueError, match="no target row 2"):
        speculative_verdict((4, 5), [(True, 4), (True, 5)])


def test_a_verdict_accepts_fewer_drafts_than_it_has_tokens():
    with pytest.raises(ValueError):
        Verdict((4,), 1)
