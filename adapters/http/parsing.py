"""JSON bodies of completion and chat requests into API requests (translation only, no rules)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from adapters.http.fields import (
    as_int_list,
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
    read_text_parts,
)
from domain.common.errors import InvalidRequestError
from domain.common.ranges import COMPLETION_MAX_TOKENS, TOKEN_BUDGET, check_token_ids
from domain.emission.detokenizer import decode_whole
from domain.logprobs.rules import LogprobAsk
from domain.requests.api_request import ApiRequest, Prompt, StreamOptions
from domain.requests.sampling import SamplingParams
from domain.structured.rules import StructuredAsk, resolve_structure

_ROLES = ("system", "user", "assistant", "developer", "tool")


class _Tokenizer(Protocol):
    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str: ...

    def token_bytes(self, token_id: int) -> bytes: ...

    @property
    def special_token_ids(self) -> frozenset[int]: ...

    @property
    def strips_leading_space(self) -> bool: ...

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, object]], *, add_generation_prompt: bool = True
    ) -> str: ...


def completion_request(raw: Any, tokenizer: _Tokenizer) -> ApiRequest:
    body = read_object(raw)
    max_tokens = read_int(body, "max_tokens", 16)
    # Checked before SamplingParams, whose budget starts at 1: the 400 gives completions' own
    # range, which has 0 (echo only).
    COMPLETION_MAX_TOKENS.check(max_tokens, "max_tokens")
    count = read_int(body, "logprobs", None)
    ask = _logprob_ask(body, wanted=count is not None, count=count, count_param="logprobs")
    prompts = _completion_prompts(body.get("prompt"), tokenizer)
    return _api_request(body, prompts, max_tokens, ask, _structured_ask(body, chat=False))


def chat_request(raw: Any, tokenizer: _Tokenizer, *, auto_tool_choice: bool = False) -> ApiRequest:
    """`auto_tool_choice`: the server parses tool calls (`--enable-auto-tool-choice`)."""
    body = read_object(raw)
    ask = _logprob_ask(
        body,
        wanted=read_bool(body, "logprobs", False),
        count=read_int(body, "top_logprobs", None),
        count_param="top_logprobs",
        echo=False,
    )
    messages = _messages(body.get("messages"))
    add_generation_prompt = read_bool(body, "add_generation_prompt", True)
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    except ValueError as error:
        raise InvalidRequestError(f"the chat template failed: {error}", param="messages") from None
    prompt = Prompt(tuple(tokenizer.encode(text, add_special_tokens=False)), text)
    # Both budgets are read, so a bad value in the one that loses is still a 400.
    legacy_max_tokens = _token_budget(body, "max_tokens")
    max_tokens = _token_budget(body, "max_completion_tokens")
    if max_tokens is None:
        max_tokens = legacy_max_tokens
    structured = _structured_ask(body, chat=True, auto_tool_choice=auto_tool_choice)
    return _api_request(body, (prompt,), max_tokens, ask, structured)


def _token_budget(body: dict, name: str) -> int | None:
    budget = read_int(body, name, None)
    if budget is not None:
        TOKEN_BUDGET.check(budget, name)
    return budget


def _structured_ask(body: dict, *, chat: bool, auto_tool_choice: bool = False) -> StructuredAsk:
    """The output-constraint fields as sent; `domain.structured_rules` decides what they mean.
    Tools belong to chat only."""
    tool_choice = body.get("tool_choice") if chat else None
    if tool_choice is not None and not isinstance(tool_choice, (str, dict)):
        raise InvalidRequestError(
            "`tool_choice` must be a string or an object.", param="tool_choice"
        )
    return StructuredAsk(
        response_format=read_object_field(body, "response_format"),
        structured_outputs=read_object_field(body, "structured_outputs"),
        tools=read_object_list(body, "tools") if chat else None,
        tool_choice=tool_choice,
        parallel_tool_calls=read_bool(body, "parallel_tool_calls", True) if chat else True,
        auto_tool_choice=auto_tool_choice,
    )


def _api_request(
    body: dict,
    prompts: tuple[Prompt, ...],
    max_tokens: int | None,
    logprob_ask: LogprobAsk,
    structured: StructuredAsk,
) -> ApiRequest:
    n = read_int(body, "n", 1)
    params = SamplingParams(
        # An echo-only request (0) generates nothing, but its sampling settings stay valid.
        max_tokens=None if max_tokens is None else max(max_tokens, 1),
        temperature=read_float(body, "temperature", 1.0),
        top_p=read_float(body, "top_p", 1.0),
        top_k=read_int(body, "top_k", 0),
        min_p=read_float(body, "min_p", 0.0),
        presence_penalty=read_float(body, "presence_penalty", 0.0),
        frequency_penalty=read_float(body, "frequency_penalty", 0.0),
        repetition_penalty=read_float(body, "repetition_penalty", 1.0),
        seed=read_int(body, "seed", None),
        stop=read_stop(body),
        stop_token_ids=read_int_list(body, "stop_token_ids"),
        ignore_eos=read_bool(body, "ignore_eos", False),
        include_stop_str_in_output=read_bool(body, "include_stop_str_in_output", False),
        skip_special_tokens=read_bool(body, "skip_special_tokens", True),
        min_tokens=read_int(body, "min_tokens", 0),
        logit_bias=read_logit_bias(body),
    )
    return ApiRequest(
        model=read_str(body, "model", None),
        prompts=prompts,
        params=params,
        max_tokens=max_tokens,
        n=n,
        stream_options=_stream_options(body),
        logprob_ask=logprob_ask,
        return_tokens_as_token_ids=read_bool(body, "return_tokens_as_token_ids", False),
        structure=resolve_structure(structured),
        thinking_token_budget=read_int(body, "thinking_token_budget", None),
    )


def _logprob_ask(
    body: dict, *, wanted: bool, count: int | None, count_param: str, echo: bool | None = None
) -> LogprobAsk:
    """The logprob fields as sent; `domain.logprob_rules` decides which are a 400."""
    present = body.get("logprob_token_ids") is not None
    return LogprobAsk(
        wanted=wanted,
        count=count,
        count_param=count_param,
        token_ids=read_int_list(body, "logprob_token_ids") if present else None,
        echo=read_bool(body, "echo", False) if echo is None else echo,
        stream=read_bool(body, "stream", False),
        prompt_logprobs=read_int(body, "prompt_logprobs", None),
    )


def _stream_options(body: dict) -> StreamOptions | None:
    raw = body.get("stream_options")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise InvalidRequestError("`stream_options` must be an object.", param="stream_options")
    return StreamOptions(
        read_bool(raw, "include_usage", False, within="stream_options"),
        read_bool(raw, "continuous_usage_stats", False, within="stream_options"),
    )


def _completion_prompts(raw: Any, tokenizer: _Tokenizer) -> tuple[Prompt, ...]:
    if isinstance(raw, str):
        return (_text_prompt(raw, tokenizer),)
    if isinstance(raw, list) and raw:
        token_ids = as_int_list(raw)
        if token_ids is not None:
            return (_token_prompt(token_ids, tokenizer),)
        if all(isinstance(item, str) for item in raw):
            return tuple(_text_prompt(item, tokenizer) for item in raw)
        batch = [as_int_list(item) for item in raw]
        lists = [token_ids for token_ids in batch if token_ids]
        if len(lists) == len(batch):  # every item is a non-empty list of token IDs
            return tuple(_token_prompt(token_ids, tokenizer) for token_ids in lists)
    raise InvalidRequestError(
        "`prompt` must be a non-empty string, a list of strings, a list of token IDs or a list "
        "of token ID lists",
        param="prompt",
    )


def _text_prompt(text: str, tokenizer: _Tokenizer) -> Prompt:
    if not text:
        raise InvalidRequestError("the prompt must not be empty", param="prompt")
    if not is_text(text):
        raise InvalidRequestError("the prompt must be valid Unicode", param="prompt")
    return Prompt(tuple(tokenizer.encode(text)), text)


def _token_prompt(token_ids: list[int], tokenizer: _Tokenizer) -> Prompt:
    check_token_ids(token_ids, tokenizer.vocab_size, "prompt")
    # Echoed as the server's decoder shows text (contracts/api.md, "Text offsets"): a
    # byte-fallback decoder would turn a run of byte pieces holding any invalid byte into one
    # U+FFFD per byte, valid characters included, which the echoed offsets cannot index.
    text = decode_whole(tokenizer, token_ids, skip_special_tokens=False).text
    return Prompt(tuple(token_ids), text)


def _messages(raw: Any) -> list[dict]:
    if not isinstance(raw, list) or not raw:
        raise InvalidRequestError("`messages` must be a non-empty list", param="messages")
    return [_message(message) for message in raw]


def _message(raw: Any) -> dict:
    """A message as the chat template sees it: role and text content.

    As in OpenAI's API, only an assistant message that carries `tool_calls` may leave `content`
    out or null. The template sees such a message with empty content, never its calls.
    """
    if not isinstance(raw, dict) or raw.get("role") not in _ROLES:
        raise InvalidRequestError(
            f"each message needs a role, one of {', '.join(_ROLES)}", param="messages"
        )
    role, content = raw["role"], raw.get("content")
    has_tool_calls = _tool_calls(raw.get("tool_calls"))
    if content is None and not (role == "assistant" and has_tool_calls):
        raise InvalidRequestError(
            f"a {role} message needs `content`; only an assistant message with `tool_calls` "
            "may leave it out",
            param="messages",
        )
    return {"role": role, "content": "" if content is None else _content(content)}


def _tool_calls(raw: Any) -> bool:
    """Whether a message carries tool calls; `tool_calls` is absent, null or a non-empty list of
    objects."""
    if raw is None:
        return False
    if not isinstance(raw, list) or not raw or not all(isinstance(c, dict) for c in raw):
        raise InvalidRequestError(
            "`tool_calls` must be a non-empty list of objects", param="messages"
        )
    return True


def _content(raw: Any) -> str:
    return read_text_parts(
        raw,
        ("text",),
        param="messages",
        what="message content",
        bad_part="message content parts must be text parts",
    )
