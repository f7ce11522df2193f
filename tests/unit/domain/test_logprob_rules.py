"""Which logprob requests get a 400: every rule of `check_logprob_ask`, its param and order."""

from __future__ import annotations

import pytest

from domain.common.errors import InvalidRequestError
from domain.logprobs.rules import (
    LogprobAsk,
    LogprobLimits,
    check_logprob_ask,
    responses_include,
    responses_logprob_ask,
)
from domain.logprobs.values import LogprobOptions

FULL = LogprobLimits(
    top_k=20, selects_ids=True, scores_prompts=True, max_logprobs=20, vocab_size=50
)
NATURAL = LogprobLimits(
    top_k=5, selects_ids=False, scores_prompts=False, max_logprobs=20, vocab_size=50
)
NONE = LogprobLimits(
    top_k=0, selects_ids=False, scores_prompts=False, max_logprobs=20, vocab_size=50
)
CAPPED = LogprobLimits(
    top_k=20, selects_ids=True, scores_prompts=True, max_logprobs=3, vocab_size=50
)
COMPLETION = {"wanted": True, "count_param": "logprobs"}
CHAT = {"count_param": "top_logprobs"}


def refusal(ask: LogprobAsk, limits: LogprobLimits) -> tuple[str | None, str]:
    with pytest.raises(InvalidRequestError) as caught:
        check_logprob_ask(ask, limits)
    return caught.value.param, caught.value.message


@pytest.mark.parametrize(
    ("ask", "limits", "param", "words"),
    [
        (LogprobAsk(count=-1, **COMPLETION), FULL, "logprobs", "positive value or 0"),
        (LogprobAsk(count=21, **COMPLETION), FULL, "logprobs", "max allowed: 20"),
        (LogprobAsk(wanted=True, count=-1, **CHAT), FULL, "top_logprobs", "positive value"),
        (LogprobAsk(wanted=False, count=2, **CHAT), FULL, "top_logprobs", "must be set to true"),
        (LogprobAsk(token_ids=(), **COMPLETION), FULL, "logprob_token_ids", "must not be empty"),
        (LogprobAsk(token_ids=(3,)), FULL, "logprob_token_ids", "`logprobs` must be set"),
        (LogprobAsk(prompt_logprobs=-1), FULL, "prompt_logprobs", "positive value or 0"),
        (LogprobAsk(prompt_logprobs=21), FULL, "prompt_logprobs", "max allowed: 20"),
        (LogprobAsk(prompt_logprobs=1, stream=True), FULL, "prompt_logprobs", "stream=True"),
        (
            LogprobAsk(echo=True, token_ids=(1, 2), **COMPLETION),
            FULL,
            "logprob_token_ids",
            "cannot be combined with `echo`",
        ),
        (LogprobAsk(count=0, **COMPLETION), NONE, "logprobs", "no logprob outputs"),
        (LogprobAsk(wanted=True, **CHAT), NONE, "logprobs", "no logprob outputs"),
        (LogprobAsk(count=6, **COMPLETION), NATURAL, "logprobs", "max allowed: 5"),
        (LogprobAsk(wanted=True, count=4, **CHAT), CAPPED, "top_logprobs", "max allowed: 3"),
        (LogprobAsk(token_ids=(1,), **COMPLETION), NATURAL, "logprob_token_ids", "natural"),
        (
            LogprobAsk(token_ids=tuple(range(129)), **COMPLETION),
            FULL,
            "logprob_token_ids",
            "greater than max allowed: 128",
        ),
        (LogprobAsk(token_ids=(4, 4), **COMPLETION), FULL, "logprob_token_ids", "distinct"),
        (LogprobAsk(token_ids=(50,), **COMPLETION), FULL, "logprob_token_ids", "vocabulary"),
        (LogprobAsk(token_ids=(2**40,), **COMPLETION), FULL, "logprob_token_ids", "integer from"),
        (LogprobAsk(prompt_logprobs=1), NATURAL, "prompt_logprobs", "--prompt-logprobs"),
        (LogprobAsk(echo=True, count=1, **COMPLETION), NATURAL, "prompt_logprobs", "scoring"),
        (LogprobAsk(prompt_logprobs=4), CAPPED, "prompt_logprobs", "max allowed: 3"),
    ],
)
def test_each_rule_is_a_400_naming_its_field(ask, limits, param, words):
    got_param, message = refusal(ask, limits)

    assert got_param == param
    assert words in message


@pytest.mark.parametrize(
    "ask",
    [
        LogprobAsk(),
        LogprobAsk(count=20, **COMPLETION),
        LogprobAsk(wanted=True, count=0, **CHAT),
        LogprobAsk(token_ids=tuple(range(50)), **COMPLETION),
        LogprobAsk(echo=True, count=3, prompt_logprobs=20, **COMPLETION),
        LogprobAsk(echo=True),
        LogprobAsk(stream=True, count=2, **COMPLETION),
    ],
)
def test_requests_within_every_rule_pass(ask):
    check_logprob_ask(ask, FULL)


def test_the_first_broken_rule_decides_the_error():
    ask = LogprobAsk(count=21, token_ids=(), prompt_logprobs=1, stream=True, **COMPLETION)

    assert refusal(ask, NONE)[0] == "logprobs"
    assert refusal(LogprobAsk(token_ids=(), prompt_logprobs=-1), NONE)[0] == "logprob_token_ids"


def test_the_ask_resolves_to_the_options_and_the_prompt_alternatives_it_means():
    echoed = LogprobAsk(echo=True, count=3, **COMPLETION)
    selecting = LogprobAsk(token_ids=(7, 2), **COMPLETION)

    assert echoed.options == LogprobOptions(top_k=3) and echoed.prompt_top_k == 3
    assert LogprobAsk(echo=True, count=3, prompt_logprobs=1, **COMPLETION).prompt_top_k == 1
    assert selecting.options == LogprobOptions(top_k=0, token_ids=(7, 2))
    assert selecting.prompt_top_k is None
    assert LogprobAsk(echo=True).options is None and LogprobAsk(echo=True).prompt_top_k is None


OUTPUT_TEXT = "message.output_text.logprobs"


def test_a_responses_include_of_the_output_text_logprobs_asks_for_logprobs():
    assert responses_include([OUTPUT_TEXT]) is True
    assert responses_include([]) is False


def test_a_responses_include_of_anything_else_is_a_400_naming_include():
    with pytest.raises(InvalidRequestError) as caught:
        responses_include([OUTPUT_TEXT, "reasoning.encrypted_content"])

    assert caught.value.param == "include"
    assert "'reasoning.encrypted_content' is not served" in caught.value.message


@pytest.mark.parametrize(
    ("count", "token_ids", "param"),
    [(2, None, "top_logprobs"), (None, (3,), "logprob_token_ids"), (2, (3,), "top_logprobs")],
)
def test_responses_top_logprobs_or_selected_ids_without_the_include_are_a_400(
    count, token_ids, param
):
    with pytest.raises(InvalidRequestError) as caught:
        responses_logprob_ask(False, count, token_ids)

    assert caught.value.param == param
    assert caught.value.message == f"`{param}` needs `include: [{OUTPUT_TEXT!r}]`"


def test_responses_zero_top_logprobs_or_empty_ids_need_no_include():
    # Empty selected IDs are refused later, by check_logprob_ask's rule 3, with chat's wording.
    ask = responses_logprob_ask(False, 0, ())

    assert ask == LogprobAsk(wanted=False, count=0, count_param="top_logprobs", token_ids=())


def test_a_responses_ask_names_top_logprobs_as_its_count():
    ask = responses_logprob_ask(True, 3, (5, 6))

    assert ask == LogprobAsk(wanted=True, count=3, count_param="top_logprobs", token_ids=(5, 6))
