"""What completions and chat share: vLLM's common fields and the API request built from them."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta, Struct

from adapters.http.requests.declared import (
    Choices,
    Flag,
    Integer,
    JsonObject,
    ThinkingBudget,
    TokenIds,
    whole,
    whole_or_none,
)
from adapters.http.requests.sampling import Generating, sampling_params
from domain.logprobs.rules import LogprobAsk
from domain.requests.api_request import ApiRequest, Prompt
from domain.requests.api_request import StreamOptions as StreamSettings
from domain.structured.rules import StructuredAsk, resolve_structure


class StreamOptions(Struct, kw_only=True, frozen=True):
    include_usage: Flag | None = None
    continuous_usage_stats: Flag | None = None


class GenerationBody(Generating, frozen=True):
    """The fields of `POST /v1/completions` and `POST /v1/chat/completions` alike."""

    stop_token_ids: TokenIds | None = None
    include_stop_str_in_output: Flag | None = None
    skip_special_tokens: Flag | None = None
    n: Choices | None = None
    stream_options: Annotated[StreamOptions, Meta(description="an object")] | None = None
    prompt_logprobs: Integer | None = None
    response_format: JsonObject | None = None
    thinking_token_budget: ThinkingBudget | None = None


def logprob_ask(
    body: GenerationBody, *, wanted: bool, count: int | None, count_param: str, echo: bool
) -> LogprobAsk:
    """The logprob fields as sent; `domain.logprobs.rules` decides which are a 400."""
    token_ids = body.logprob_token_ids
    return LogprobAsk(
        wanted=wanted,
        count=count,
        count_param=count_param,
        token_ids=None if token_ids is None else tuple(whole(t) for t in token_ids),
        echo=echo,
        stream=bool(body.stream),
        prompt_logprobs=whole_or_none(body.prompt_logprobs),
    )


def api_request(
    body: GenerationBody,
    prompts: tuple[Prompt, ...],
    max_tokens: int | None,
    ask: LogprobAsk,
    structured: StructuredAsk,
) -> ApiRequest:
    options = body.stream_options
    return ApiRequest(
        model=body.model,
        prompts=prompts,
        # An echo-only request (0) generates nothing, but its sampling settings stay valid.
        params=sampling_params(body, None if max_tokens is None else max(max_tokens, 1)),
        max_tokens=max_tokens,
        n=1 if body.n is None else whole(body.n),
        stream_options=None
        if options is None
        else StreamSettings(bool(options.include_usage), bool(options.continuous_usage_stats)),
        logprob_ask=ask,
        return_tokens_as_token_ids=bool(body.return_tokens_as_token_ids),
        structure=resolve_structure(structured),
        thinking_token_budget=whole_or_none(body.thinking_token_budget),
        cache_salt=body.cache_salt,
    )
