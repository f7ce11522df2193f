"""Every integer a request carries has a range; outside it is a 400 naming the field."""

from __future__ import annotations

import pytest

from domain.common.errors import InvalidRequestError
from domain.common.ranges import INT32_MAX, IntRange, check_logprob_count, check_token_ids
from domain.logprobs.rules import LogprobAsk
from domain.logprobs.values import LogprobOptions
from domain.requests.api_request import ApiRequest, Prompt
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams

HUGE = 10**400
PROMPT = (Prompt((1, 2), "ab"),)


def refused(build, param: str) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as caught:
        build()
    assert caught.value.param == param
    return caught.value


def test_a_range_takes_both_bounds_and_refuses_one_past_either():
    bounds = IntRange(-1, 5)

    bounds.check(-1, "x")
    bounds.check(5, "x")

    assert (
        refused(lambda: bounds.check(6, "x"), "x").message == "`x` must be an integer from -1 to 5."
    )
    refused(lambda: bounds.check(-2, "x"), "x")


def test_a_range_error_never_quotes_the_value_however_long():
    error = refused(lambda: IntRange(0, 9).check(HUGE, "seed"), "seed")

    assert len(error.message) < 100


@pytest.mark.parametrize(
    ("field", "inside", "outside"),
    [
        ("max_tokens", [1, INT32_MAX], [0, INT32_MAX + 1, HUGE]),
        ("top_k", [-1, 0, 1, INT32_MAX], [-2, INT32_MAX + 1, HUGE]),
        ("seed", [-(2**63), 2**63 - 1], [-(2**63) - 1, 2**63, 2**64 - 1, -HUGE]),
        ("min_tokens", [0, 16], [-1, INT32_MAX + 1, HUGE]),
    ],
)
def test_sampling_integers_keep_to_their_ranges(field, inside, outside):
    for value in inside:
        SamplingParams(**{"max_tokens": None, field: value})

    for value in outside:
        refused(lambda value=value: SamplingParams(**{field: value}), field)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("stop_token_ids", (1, INT32_MAX + 1)),
        ("stop_token_ids", (-1,)),
        ("logit_bias", ((HUGE, 1.0),)),
        ("logit_bias", ((-1, 1.0),)),
    ],
)
def test_token_ids_in_sampling_settings_are_int32_and_non_negative(field, value):
    refused(lambda: SamplingParams(**{field: value}), field)


def test_in_range_seeds_still_derive_the_same_choice_seeds():
    def seeds(seed: int) -> list[int]:
        request = EngineRequest("r", (1,), SamplingParams(seed=seed), n=2)
        return [request.choice_seed(index, fallback=0) for index in range(2)]

    # Pinned values: a negative seed is its two's-complement pattern, as before the range.
    assert seeds(5) == [5, 5 ^ 0x9E3779B97F4A7C15]
    assert seeds(-1) == [2**64 - 1, (2**64 - 1) ^ 0x9E3779B97F4A7C15]
    assert seeds(2**63 - 1)[0] == 2**63 - 1


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 0}, "n"),
        ({"n": 17}, "n"),
        ({"n": HUGE}, "n"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": INT32_MAX + 1}, "max_tokens"),
    ],
)
def test_job_integers_keep_to_their_ranges(fields, param):
    def build() -> ApiRequest:
        return ApiRequest(None, PROMPT, SamplingParams(), **{"max_tokens": 1, **fields})

    refused(build, param)


def test_a_job_takes_the_largest_budget_and_twenty_prompt_alternatives():
    job = ApiRequest(
        None,
        PROMPT,
        SamplingParams(),
        max_tokens=INT32_MAX,
        n=16,
        logprob_ask=LogprobAsk(prompt_logprobs=20),
    )

    assert job.max_tokens == INT32_MAX


def test_prompt_token_ids_are_int32_and_non_negative():
    refused(lambda: Prompt((1, INT32_MAX + 1), "x"), "prompt")
    refused(lambda: Prompt((-1,), "x"), "prompt")


def test_logprob_options_keep_to_the_most_any_core_serves():
    LogprobOptions(top_k=20, token_ids=(0, INT32_MAX))

    assert "greater than max allowed: 20" in refused(lambda: LogprobOptions(21), "logprobs").message
    refused(lambda: LogprobOptions(-1), "logprobs")
    refused(lambda: LogprobOptions(1, (HUGE,)), "logprob_token_ids")


def test_a_negative_logprob_count_uses_vllms_wording():
    error = refused(
        lambda: check_logprob_count("prompt", -1, 20, "prompt_logprobs"), "prompt_logprobs"
    )

    assert error.message == "`prompt_logprobs` must be a positive value or 0."


def test_token_ids_outside_the_vocabulary_are_quoted_and_huge_ones_are_not():
    inside_int32 = refused(lambda: check_token_ids([3, 700], 512, "tokens"), "tokens")
    huge = refused(lambda: check_token_ids([HUGE], 512, "tokens"), "tokens")

    assert inside_int32.message == "token ID 700 is outside the vocabulary of 512"
    assert huge.message == "each item of `tokens` must be an integer from 0 to 2147483647."
