"""Publishing prompt scores: order, duplicates after readmission, channel merging, wire shapes."""

from __future__ import annotations

import pytest

from domain.common.errors import LogprobDataError
from domain.emission.channel import OutputChannel
from domain.emission.outputs import ChoiceDelta, PromptScores
from domain.logprobs.prompt_scores import PromptScore, new_prompt_scores
from domain.logprobs.values import TokenLogprob
from domain.presentation.logprobs import (
    TokenRendering,
    echo_logprobs,
    prompt_offsets,
    vllm_prompt_logprobs,
)

PROMPT = (5, 6, 7, 8, 9)


def score(token_id: int, logprob: float = -1.0, rank: int = 2, alternatives=()) -> PromptScore:
    return PromptScore(token_id, logprob, rank, tuple(alternatives))


def test_a_chunk_publishes_its_rows_in_order_and_skips_the_prompt_end():
    rows = [score(6), score(7), score(8), score(9), None]
    assert new_prompt_scores(PROMPT, 0, 0, rows) == tuple(rows[:4])


def test_rows_published_before_a_preemption_are_not_published_again():
    rows = [None, None, score(8), score(9)]
    assert new_prompt_scores(PROMPT, 2, 0, rows) == (score(8), score(9))


@pytest.mark.parametrize(
    ("scored_rows", "chunk_start", "rows"),
    [
        (0, 0, None),  # the frame carries nothing for a scored lane
        (0, 0, [score(6), None]),  # a row with a target but no score
        (0, 0, [score(99)]),  # a score naming the wrong token
        (0, 2, [score(8)]),  # a gap: rows 0 and 1 were never published
    ],
)
def test_missing_or_inconsistent_rows_fail_the_request(scored_rows, chunk_start, rows):
    with pytest.raises(LogprobDataError):
        new_prompt_scores(PROMPT, scored_rows, chunk_start, rows)


def test_a_full_channel_merges_consecutive_prompt_scores_but_never_past_a_delta():
    channel = OutputChannel(capacity=3)
    channel.put(PromptScores(1, (score(6),)))
    channel.put(PromptScores(2, (score(7),)))
    channel.put(PromptScores(3, (score(8),)))
    first = channel.get_nowait()
    second = channel.get_nowait()
    assert first == PromptScores(1, (score(6),))
    assert second == PromptScores(2, (score(7), score(8)))

    channel.put(PromptScores(4, (score(9),)))
    channel.put(ChoiceDelta(0, "a"))
    channel.put(PromptScores(5, (score(10),)))  # full: it may not merge past the delta
    assert [type(item) for item in (channel.get_nowait() for _ in range(3))] == [
        PromptScores,
        ChoiceDelta,
        PromptScores,
    ]


def test_prompt_scores_start_after_position_zero_and_merge_only_when_consecutive():
    with pytest.raises(ValueError):
        PromptScores(0, (score(5),))
    with pytest.raises(ValueError):
        PromptScores(1, (score(6),)).merge(PromptScores(3, (score(8),)))


def rendering() -> TokenRendering:
    return TokenRendering(lambda token_id: f"t{token_id}".encode())


def test_vllm_prompt_logprobs_put_the_prompt_token_first_and_rank_ties_alike():
    alternatives = [TokenLogprob(1, -0.5), TokenLogprob(2, -0.5), TokenLogprob(3, -0.7)]
    scores = [score(6, -0.7, 3, alternatives), score(7, -0.5, 1, alternatives)]
    listed = vllm_prompt_logprobs((5, 6, 7), scores, 3, rendering())

    assert listed[0] is None
    assert list(listed[1]) == ["6", "1", "2", "3"]
    assert listed[1]["1"] == {"logprob": -0.5, "rank": 1, "decoded_token": "t1"}
    assert listed[1]["2"]["rank"] == 1 and listed[1]["3"]["rank"] == 3
    assert listed[1]["6"] == {"logprob": -0.7, "rank": 3, "decoded_token": "t6"}
    assert list(listed[2]) == ["7", "1", "2", "3"]


def test_echo_logprobs_lead_with_a_null_position_and_cap_alternatives_at_k():
    alternatives = [TokenLogprob(6, -0.1), TokenLogprob(2, -0.2)]
    echoed = echo_logprobs((5, 6), [score(6, -0.1, 1, alternatives)], 1, rendering(), [0, 2])

    assert echoed == {
        "text_offset": [0, 2],
        "token_logprobs": [None, -0.1],
        "tokens": ["t5", "t6"],
        "top_logprobs": [None, {"t6": -0.1}],
    }


def test_a_score_count_that_does_not_fit_the_prompt_is_refused():
    with pytest.raises(ValueError):
        echo_logprobs((5, 6, 7), [score(6)], 1, rendering(), [0, 2, 4])


class _Tokenizer:
    """Token 0 is a special BOS with text "<s>"; the others are letters."""

    special_token_ids = frozenset({0})
    strips_leading_space = False

    @staticmethod
    def token_bytes(token_id: int) -> bytes:
        return b"<s>" if token_id == 0 else bytes([ord("a") + token_id])


def test_prompt_offsets_index_into_the_echoed_text_with_or_without_a_bos():
    assert prompt_offsets((0, 1, 2), _Tokenizer(), "<s>bc") == [0, 3, 4]
    # A text prompt echoes the request's string, which has no text for the added BOS.
    assert prompt_offsets((0, 1, 2), _Tokenizer(), "bc") == [0, 0, 1]
