"""`cache_salt`'s rule, and how usage reports the prompt tokens read from the prefix cache."""

from __future__ import annotations

import pytest

from domain.cache.salt import check_cache_salt
from domain.common.errors import InvalidRequestError
from domain.emission.outputs import Usage
from domain.presentation.objects import usage_object
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams


@pytest.mark.parametrize("salt", [None, "a", "tenant-42", "é" * 128, "x" * 256])
def test_a_non_empty_salt_of_at_most_256_bytes_is_taken(salt):
    check_cache_salt(salt)


@pytest.mark.parametrize("salt", ["", 7, ["a"], "x" * 257, "é" * 129])
def test_an_empty_long_or_non_string_salt_is_a_400_naming_it(salt):
    with pytest.raises(InvalidRequestError) as caught:
        check_cache_salt(salt)

    assert caught.value.param == "cache_salt"


def test_an_engine_request_checks_its_salt():
    with pytest.raises(InvalidRequestError, match="cache_salt"):
        EngineRequest("r", (1, 2), SamplingParams(max_tokens=1), cache_salt="")


def test_usage_names_cached_prompt_tokens_only_when_there_are_some():
    assert usage_object(Usage(20, 3)) == {
        "prompt_tokens": 20,
        "completion_tokens": 3,
        "total_tokens": 23,
    }
    assert usage_object(Usage(20, 3, 16))["prompt_tokens_details"] == {"cached_tokens": 16}


def test_usages_add_up_with_their_cached_tokens():
    assert Usage(5, 1, 0) + Usage(20, 3, 16) == Usage(25, 4, 16)
