"""Prompt scores: the target rule for prefill chunks and the packed 43-word row."""

from __future__ import annotations

import math
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain.logprobs.prompt_scores import (
    INVALID_BITS,
    PROMPT_ROW_WORDS,
    PromptScore,
    prompt_targets,
    unpack_prompt_row,
)
from domain.logprobs.values import NATURAL_TOP_K, NO_TOKEN, TokenLogprob, float_to_bits


def packed(token_id: int, logprob: float, rank: int, pairs: list[tuple[int, float]]) -> list[int]:
    words = [token_id, float_to_bits(logprob), rank]
    for alternative_id, value in pairs:
        words += [alternative_id, float_to_bits(value)]
    return words + [NO_TOKEN, 0] * (NATURAL_TOP_K - len(pairs))


def test_layout_constants_match_the_contract() -> None:
    assert (PROMPT_ROW_WORDS, NATURAL_TOP_K) == (43, 20)


def test_a_valid_row_unpacks_to_its_score_and_all_twenty_alternatives() -> None:
    pairs = [(100 + index, -0.5 * index) for index in range(NATURAL_TOP_K)]
    score = unpack_prompt_row(packed(7, -1.25, 3, pairs))
    assert score == PromptScore(
        7, -1.25, 3, tuple(TokenLogprob(token_id, value) for token_id, value in pairs)
    )


def test_alternatives_stop_at_the_first_missing_id_of_a_small_vocabulary() -> None:
    score = unpack_prompt_row(packed(1, -0.125, 1, [(1, -0.125), (0, -2.5)]))
    assert score is not None
    assert score.alternatives == (TokenLogprob(1, -0.125), TokenLogprob(0, -2.5))


def test_the_invalid_row_unpacks_to_none() -> None:
    words = [NO_TOKEN, INVALID_BITS, 0] + [NO_TOKEN, 0] * NATURAL_TOP_K
    assert unpack_prompt_row(words) is None


def test_a_real_token_with_nan_bits_unpacks_to_a_nan_logprob() -> None:
    words = [NO_TOKEN, INVALID_BITS, 0] + [NO_TOKEN, 0] * NATURAL_TOP_K
    words[0] = 5
    words[2] = 1
    score = unpack_prompt_row(words)
    assert score is not None and math.isnan(score.logprob)


def test_a_row_of_the_wrong_width_is_rejected() -> None:
    with pytest.raises(ValueError, match="43 words"):
        unpack_prompt_row([0] * (PROMPT_ROW_WORDS - 1))


def test_a_real_token_with_rank_zero_is_malformed() -> None:
    with pytest.raises(ValueError, match="rank"):
        unpack_prompt_row(packed(4, -1.0, 0, []))


def test_a_score_rejects_negative_ids_and_too_many_alternatives() -> None:
    with pytest.raises(ValueError, match="token_id"):
        PromptScore(-1, 0.0, 1)
    with pytest.raises(ValueError, match="alternatives"):
        PromptScore(0, 0.0, 1, (TokenLogprob(0, 0.0),) * (NATURAL_TOP_K + 1))


def test_each_row_targets_the_next_prompt_token_and_the_last_row_targets_nothing() -> None:
    prompt = [10, 11, 12, 13]
    assert prompt_targets(prompt, 0, 2) == [11, 12]
    assert prompt_targets(prompt, 2, 2) == [13, NO_TOKEN]
    assert prompt_targets(prompt, 1, 0) == []


@pytest.mark.parametrize(("start", "length"), [(-1, 1), (0, -1), (3, 2), (0, 5)])
def test_a_chunk_outside_the_prompt_is_rejected(start: int, length: int) -> None:
    with pytest.raises(ValueError, match="outside"):
        prompt_targets([1, 2, 3, 4], start, length)


@given(
    prompt=st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=300),
    cuts=st.lists(st.integers(0, 300), max_size=6),
)
def test_chunk_targets_concatenate_to_the_prompt_shifted_by_one(
    prompt: list[int], cuts: list[int]
) -> None:
    bounds = sorted({0, len(prompt), *(cut % (len(prompt) + 1) for cut in cuts)})
    targets: list[int] = []
    for start, stop in pairwise(bounds):
        chunk = prompt_targets(prompt, start, stop - start)
        assert len(chunk) == stop - start
        targets += chunk
    assert targets == prompt[1:] + [NO_TOKEN]
