"""Speculative decoding in the domain: the config, the history proposer, scheduling and commit."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain.speculation.drafts import (
    NgramProposer,
    SpeculativeConfig,
    SpeculativeConfigError,
    SpeculativeMethod,
)


def test_an_ngram_config_in_vllm_s_shape_reads_back_to_itself():
    config = SpeculativeConfig.from_json(
        '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,'
        ' "prompt_lookup_max": 3}'
    )

    assert config == SpeculativeConfig(SpeculativeMethod.NGRAM, 4, 2, 3)
    assert SpeculativeConfig.from_json(config.to_json()) == config


@pytest.mark.parametrize(
    ("window", "expected"),
    [({}, (5, 5)), ({"prompt_lookup_max": 3}, (3, 3)), ({"prompt_lookup_min": 2}, (2, 2))],
)
def test_a_missing_lookup_bound_follows_vllm(window, expected):
    import json

    config = SpeculativeConfig.from_json(
        json.dumps({"method": "ngram", "num_speculative_tokens": 2, **window})
    )

    assert (config.prompt_lookup_min, config.prompt_lookup_max) == expected


def test_a_draft_model_config_names_its_model():
    config = SpeculativeConfig.from_json(
        '{"method": "draft_model", "model": "/models/small", "num_speculative_tokens": 3}'
    )

    assert config.method is SpeculativeMethod.DRAFT_MODEL and config.model == "/models/small"
    assert SpeculativeConfig.from_json(config.to_json()) == config


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("not json", "not JSON"),
        ("[1]", "JSON object"),
        ('{"method": "eagle", "num_speculative_tokens": 2}', "must be one of"),
        ('{"method": "ngram", "num_speculative_tokens": 0}', "positive integer"),
        ('{"method": "ngram", "num_speculative_tokens": "2"}', "positive integer"),
        ('{"method": "ngram", "num_speculative_tokens": 2, "speed": 1}', "unknown"),
        (
            '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4,'
            ' "prompt_lookup_max": 2}',
            "prompt_lookup_min <= prompt_lookup_max",
        ),
        ('{"method": "ngram", "num_speculative_tokens": 2, "model": "x"}', "ngram takes none"),
        ('{"method": "draft_model", "num_speculative_tokens": 2}', "needs `model`"),
    ],
)
def test_a_malformed_config_is_refused_with_a_clear_message(text, words):
    with pytest.raises(SpeculativeConfigError, match=words):
        SpeculativeConfig.from_json(text)


def test_k_must_leave_room_for_the_target_s_own_token_in_a_record():
    config = SpeculativeConfig(SpeculativeMethod.NGRAM, 8)

    config.check_token_capacity(9)
    with pytest.raises(SpeculativeConfigError, match="T = 8"):
        config.check_token_capacity(8)


def test_the_longest_matching_suffix_proposes_what_followed_its_latest_occurrence():
    proposer = NgramProposer(1, 3, [7, 1, 2, 3, 9, 4, 2, 3, 8, 1, 2, 3])

    # [1, 2, 3] occurred at 1 (then 9); the shorter [2, 3] also at 6 (then 8): longest wins.
    assert proposer.propose(2) == (9, 4)


def test_the_suffix_itself_is_not_an_earlier_occurrence():
    assert NgramProposer(1, 2, [5, 6, 7]).propose(3) == ()
    assert NgramProposer(1, 1, [5, 6, 5]).propose(3) == (6, 5)


def test_proposals_follow_appended_tokens_and_stop_at_the_history_end():
    proposer = NgramProposer(2, 2, [1, 2, 3])
    proposer.extend([1, 2])

    assert proposer.propose(5) == (3, 1, 2)
    assert proposer.propose(0) == ()


def _brute_force(history: list[int], low: int, high: int, limit: int) -> tuple[int, ...]:
    for n in range(min(high, len(history)), low - 1, -1):
        suffix = history[-n:]
        starts = [i for i in range(len(history) - n) if history[i : i + n] == suffix]
        if starts:
            follower = starts[-1] + n
            return tuple(history[follower : follower + limit])
    return ()


@given(
    history=st.lists(st.integers(0, 3), max_size=40),
    low=st.integers(1, 3),
    extra=st.integers(0, 2),
    limit=st.integers(0, 5),
    split=st.integers(0, 40),
)
def test_the_incremental_index_equals_a_brute_force_search(history, low, extra, limit, split):
    proposer = NgramProposer(low, low + extra, history[:split])
    proposer.extend(history[split:])

    assert proposer.propose(limit) == _brute_force(history, low, low + extra, limit)
