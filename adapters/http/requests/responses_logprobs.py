"""The logprob fields of a Responses body, under the Responses logprob rules of the domain."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from adapters.http.requests.declared import whole, whole_or_none
from domain.logprobs.rules import LogprobAsk, responses_include, responses_logprob_ask


def logprob_ask(
    include: Sequence[str] | None,
    top_logprobs: int | float | None,
    logprob_token_ids: Sequence[int | float] | None,
    *,
    stream: bool,
) -> LogprobAsk:
    """In the order api.md gives their 400s: `include`, then the fields that need it."""
    wanted = responses_include(include or [])
    sent = None
    if logprob_token_ids is not None:
        sent = tuple(whole(token_id) for token_id in logprob_token_ids)
    ask = responses_logprob_ask(wanted, whole_or_none(top_logprobs), sent)
    return replace(ask, stream=stream)
