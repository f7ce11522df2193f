"""The sampling fields every generating endpoint declares, and the one sampling build."""

from __future__ import annotations

from typing import Any

from adapters.http.requests.declared import (
    Body,
    CacheSalt,
    Flag,
    Integers,
    JsonObject,
    LogitBias,
    MinTokens,
    Number,
    Seed,
    Stop,
    Text,
    TopK,
    whole,
)
from adapters.http.requests.decoding import decimal_int
from domain.requests.sampling import SamplingParams

# Fields taken as they are; an absent (or null) one keeps SamplingParams' default, vLLM's.
_NUMBERS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty")
_FLAGS = ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens")


class Generating(Body, frozen=True):
    """What every generating endpoint declares: the model, streaming, vLLM's sampling fields
    (which Responses takes as extras too) and vLLM's output extras."""

    model: Text | None = None
    stream: Flag | None = None
    logprob_token_ids: Integers | None = None
    return_tokens_as_token_ids: Flag | None = None
    structured_outputs: JsonObject | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    top_k: TopK | None = None
    min_p: Number | None = None
    presence_penalty: Number | None = None
    frequency_penalty: Number | None = None
    repetition_penalty: Number | None = None
    seed: Seed | None = None
    stop: Stop | None = None
    ignore_eos: Flag | None = None
    min_tokens: MinTokens | None = None
    logit_bias: LogitBias | None = None
    cache_salt: CacheSalt | None = None


def sampling_params(body: Generating, max_tokens: int | None) -> SamplingParams:
    """Completions and chat also declare `stop_token_ids`, `include_stop_str_in_output` and
    `skip_special_tokens`, which Responses does not take."""
    sent: dict[str, Any] = {
        name: value
        for name in (*_NUMBERS, "repetition_penalty", *_FLAGS)
        if (value := getattr(body, name, None)) is not None
    }
    for name in ("top_k", "seed", "min_tokens"):
        value = getattr(body, name)
        if value is not None:
            sent[name] = whole(value)
    if body.stop is not None:
        sent["stop"] = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop)
    stop_token_ids = getattr(body, "stop_token_ids", None)
    if stop_token_ids is not None:
        sent["stop_token_ids"] = tuple(whole(token_id) for token_id in stop_token_ids)
    if body.logit_bias is not None:
        sent["logit_bias"] = tuple((decimal_int(k), v) for k, v in body.logit_bias.items())
    return SamplingParams(max_tokens=max_tokens, **sent)
