"""A `POST /v1/responses` body into an API request and the settings its response echoes."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from adapters.http.fields import (
    is_text,
    read_bool,
    read_float,
    read_int,
    read_int_list,
    read_logit_bias,
    read_object,
    read_object_field,
    read_object_list,
    read_stop,
    read_str,
)
from adapters.http.responses_input import input_messages
from domain.common.errors import InvalidRequestError
from domain.common.ranges import TOKEN_BUDGET
from domain.common.wire import JsonObject
from domain.logprobs.rules import LogprobAsk, responses_include, responses_logprob_ask
from domain.requests.api_request import ApiRequest, Prompt
from domain.requests.sampling import SamplingParams
from domain.responses.objects import ResponseSettings
from domain.responses.store import ResponseStore
from domain.structured.rules import StructuredAsk, resolve_structure
from ports.tokenizer import Tokenizer

# OpenAI's fields that change what is generated or returned.
_SERVED = {
    *("model", "input", "instructions", "max_output_tokens", "temperature", "top_p"),
    *("tools", "tool_choice", "parallel_tool_calls", "include", "top_logprobs", "stream"),
    *("store", "previous_response_id", "metadata", "text", "reasoning"),
}
# OpenAI's fields that name the caller or the billing and change nothing generated.
_IDENTIFYING = {"user", "safety_identifier", "prompt_cache_key"}
# vLLM's sampling extras, as chat takes them.
_EXTRAS = {
    *("seed", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"),
    *("stop", "ignore_eos", "min_tokens", "logit_bias", "logprob_token_ids"),
    *("return_tokens_as_token_ids", "structured_outputs"),
}
# Fields whose neutral values are accepted; any other value asks for what is not served.
_NEUTRAL = {
    "background": (False,),
    "truncation": ("disabled",),
    "service_tier": ("auto", "default"),
}
_KNOWN = _SERVED | _IDENTIFYING | _EXTRAS | set(_NEUTRAL) | {"stream_options"}
_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
_TOOL_KEYS = {"type", "name", "description", "parameters", "strict"}
_FUNCTION_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
MAX_METADATA_PAIRS = 16
# Rules shared with chat name chat's fields; a Responses 400 names the field it was sent as.
_RESPONSES_NAMES = {"max_tokens": "max_output_tokens", "response_format": "text"}


@dataclass(frozen=True, slots=True)
class ResponsesJob:
    """A Responses request: what the engine generates, what the response echoes, and the
    conversation (without instructions) that a follow-up continues."""

    api: ApiRequest
    settings: ResponseSettings
    conversation: tuple[dict, ...]


def _fail(message: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)


def responses_request(
    raw: Any, tokenizer: Tokenizer, store: ResponseStore, *, auto_tool_choice: bool = False
) -> ResponsesJob:
    """`auto_tool_choice`: the server parses tool calls (`--enable-auto-tool-choice`)."""
    body = read_object(raw)
    _check_fields(body)
    ask = _logprob_ask(body)
    previous_id = read_str(body, "previous_response_id", None)
    conversation = _previous(previous_id, store) + input_messages(_required(body, "input"))
    instructions = read_str(body, "instructions", None)
    system = [{"role": "system", "content": instructions}] if instructions else []
    try:
        text = tokenizer.apply_chat_template(system + conversation, add_generation_prompt=True)
    except ValueError as error:
        raise _fail(f"the chat template failed: {error}", "input") from None
    prompt = Prompt(tuple(tokenizer.encode(text, add_special_tokens=False)), text)
    max_tokens = read_int(body, "max_output_tokens", None)
    if max_tokens is not None:
        TOKEN_BUDGET.check(max_tokens, "max_output_tokens")
    tools = read_object_list(body, "tools") or ()
    tool_choice = body.get("tool_choice")
    text_format = _text_format(body)
    parallel = read_bool(body, "parallel_tool_calls", True)
    structured = StructuredAsk(
        response_format=_response_format(text_format),
        structured_outputs=read_object_field(body, "structured_outputs"),
        tools=tuple(_chat_tool(tool) for tool in tools) if tools else None,
        tool_choice=_chat_tool_choice(tool_choice),
        parallel_tool_calls=parallel,
        auto_tool_choice=auto_tool_choice,
    )
    params = _sampling(body, max_tokens)
    api = ApiRequest(
        model=read_str(body, "model", None),
        prompts=(prompt,),
        params=params,
        max_tokens=max_tokens,
        logprob_ask=ask,
        return_tokens_as_token_ids=read_bool(body, "return_tokens_as_token_ids", False),
        structure=resolve_structure(structured),
    )
    settings = ResponseSettings(
        instructions=instructions,
        max_output_tokens=max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        tools=tools,
        tool_choice=tool_choice if tool_choice is not None else ("auto" if tools else "none"),
        parallel_tool_calls=parallel,
        metadata=_metadata(body),
        previous_response_id=previous_id,
        store=read_bool(body, "store", True),
        text_format=text_format,
        reasoning_effort=_reasoning_effort(body),
        top_logprobs=ask.count or 0,
    )
    return ResponsesJob(api, settings, tuple(conversation))


@contextmanager
def responses_names() -> Iterator[None]:
    """Re-raises a 400 of a rule shared with chat under the field's Responses name."""
    try:
        yield
    except InvalidRequestError as error:
        param = _RESPONSES_NAMES.get(error.param or "")
        if param is None:
            raise
        raise InvalidRequestError(error.message, param=param) from None


def _check_fields(body: dict) -> None:
    """Unknown fields, and known ones asking for what is not served, are 400s naming them."""
    for name, value in body.items():
        if name not in _KNOWN:
            raise _fail(f"unknown field `{name}`", name)
        if name in _NEUTRAL and not _neutral(value, _NEUTRAL[name]):
            allowed = " or ".join(repr(v).replace("False", "false") for v in _NEUTRAL[name])
            raise _fail(f"`{name}` must be {allowed}: nothing else is served", name)
        if name in _IDENTIFYING:
            read_str(body, name, None)
    options = read_object_field(body, "stream_options") or {}
    for name in options:
        if name != "include_obfuscation":
            raise _fail(f"unknown field `stream_options.{name}`", "stream_options")
    read_bool(options, "include_obfuscation", False, within="stream_options")


def _neutral(value: object, allowed: tuple[object, ...]) -> bool:
    # By type as well as value: 0 is not `false`.
    return value is None or any(type(value) is type(a) and value == a for a in allowed)


def _required(body: dict, name: str) -> Any:
    if body.get(name) is None:
        raise _fail(f"`{name}` is required", name)
    return body[name]


def _logprob_ask(body: dict) -> LogprobAsk:
    """The logprob fields read as JSON, under the Responses logprob rules of
    `domain.logprob_rules` (in the order api.md gives their 400s)."""
    include = body.get("include")
    if include is None:
        include = []
    if not isinstance(include, list) or not all(isinstance(v, str) for v in include):
        raise _fail("`include` must be a list of strings", "include")
    wanted = responses_include(include)
    count = read_int(body, "top_logprobs", None)
    token_ids = read_int_list(body, "logprob_token_ids")
    sent = token_ids if body.get("logprob_token_ids") is not None else None
    ask = responses_logprob_ask(wanted, count, sent)
    return replace(ask, stream=read_bool(body, "stream", False))


def _previous(response_id: str | None, store: ResponseStore) -> list[dict]:
    if response_id is None:
        return []
    stored = store.get(response_id)
    if stored is None:
        raise _fail(
            f"Previous response with id {response_id!r} not found: it was never stored "
            "(`store: false`), or this server has let it go (it keeps the most recent ones)",
            "previous_response_id",
        )
    return [dict(message) for message in stored.conversation]


def _sampling(body: dict, max_tokens: int | None) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=read_float(body, "temperature", 1.0),
        top_p=read_float(body, "top_p", 1.0),
        top_k=read_int(body, "top_k", 0),
        min_p=read_float(body, "min_p", 0.0),
        presence_penalty=read_float(body, "presence_penalty", 0.0),
        frequency_penalty=read_float(body, "frequency_penalty", 0.0),
        repetition_penalty=read_float(body, "repetition_penalty", 1.0),
        seed=read_int(body, "seed", None),
        stop=read_stop(body),
        ignore_eos=read_bool(body, "ignore_eos", False),
        min_tokens=read_int(body, "min_tokens", 0),
        logit_bias=read_logit_bias(body),
    )


def _chat_tool(tool: Mapping[str, object]) -> JsonObject:
    """A Responses function tool (flat) in chat's spelling, which the tool rules read."""
    name = tool.get("name")
    if tool.get("type") != "function":
        raise _fail(
            f"tools of type {tool.get('type')!r} are not served; only function tools are",
            "tools",
        )
    unknown = sorted(set(tool) - _TOOL_KEYS)
    if unknown:
        raise _fail(f"unknown field `{unknown[0]}` in a function tool", "tools")
    _check_optional(tool, "tools")
    if not isinstance(name, str) or not _FUNCTION_NAME.fullmatch(name):
        raise _fail(
            "each function tool needs a `name` of 1 to 64 letters, digits, underscores or dashes",
            "tools",
        )
    function = {key: tool[key] for key in ("name", "description", "parameters") if key in tool}
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: Any) -> str | JsonObject | None:
    if choice is None or choice in ("none", "auto", "required"):
        return choice
    name = choice.get("name") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not is_text(name):
        raise _fail(
            '`tool_choice` must be "none", "auto", "required" or {"type": "function", "name": ...}',
            "tool_choice",
        )
    return {"type": "function", "function": {"name": name}}


def _text_format(body: dict) -> JsonObject:
    text = read_object_field(body, "text") or {}
    unknown = sorted(set(text) - {"format", "verbosity"})
    if unknown:
        raise _fail(f"unknown field `text.{unknown[0]}`", "text")
    if text.get("verbosity") is not None:
        raise _fail("`text.verbosity` is not served", "text")
    form = text.get("format")
    if form is None:
        return {"type": "text"}
    if not isinstance(form, dict) or form.get("type") not in ("text", "json_object", "json_schema"):
        raise _fail("`text.format.type` must be one of text, json_object, json_schema", "text")
    if form["type"] == "json_schema":
        if not is_text(form.get("name")) or not isinstance(form.get("schema"), dict):
            raise _fail(
                "`text.format` of type json_schema needs a `name` and a `schema` object", "text"
            )
        _check_optional(form, "text")
        keys = ("type", "name", "schema", "description", "strict")
        return {key: form[key] for key in keys if form.get(key) is not None}
    return {"type": form["type"]}


def _check_optional(value: Mapping[str, object], param: str) -> None:
    """`description` (a string) and `strict` (a boolean) are accepted, not used: every schema
    is enforced strictly."""
    description, strict = value.get("description"), value.get("strict")
    if description is not None and not is_text(description):
        raise _fail("`description` must be a string of valid Unicode", param)
    if strict is not None and not isinstance(strict, bool):
        raise _fail("`strict` must be a boolean", param)


def _response_format(text_format: JsonObject) -> JsonObject | None:
    """`text.format` as chat's `response_format`, which the structured-output rules read."""
    if text_format["type"] == "json_schema":
        inner = {"name": text_format["name"], "schema": text_format["schema"]}
        return {"type": "json_schema", "json_schema": inner}
    return {"type": text_format["type"]}


def _reasoning_effort(body: dict) -> str | None:
    """`reasoning.effort` is recorded and echoed; generation does not depend on it."""
    reasoning = read_object_field(body, "reasoning") or {}
    for name, value in reasoning.items():
        if name == "effort" and (value is None or value in _EFFORTS):
            continue
        if name in ("summary", "generate_summary") and value is None:
            continue
        if name in ("summary", "generate_summary"):
            raise _fail("reasoning summaries are not generated; leave `summary` unset", "reasoning")
        raise _fail(
            f"`reasoning.{name}` must be one of {', '.join(_EFFORTS)}"
            if name == "effort"
            else f"unknown field `reasoning.{name}`",
            "reasoning",
        )
    return reasoning.get("effort")


def _metadata(body: dict) -> dict[str, str]:
    metadata = read_object_field(body, "metadata") or {}
    if len(metadata) > MAX_METADATA_PAIRS or not all(
        is_text(key) and len(key) <= 64 and is_text(value) and len(value) <= 512
        for key, value in metadata.items()
    ):
        raise _fail(
            f"`metadata` holds at most {MAX_METADATA_PAIRS} pairs of keys up to 64 characters "
            "and string values up to 512",
            "metadata",
        )
    return dict(metadata)
