"""The body of `POST /v1/responses`: the API request and the settings its response echoes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Any

from msgspec import Meta

from adapters.http.requests.declared import (
    Flag,
    Integer,
    Objects,
    Text,
    TokenBudget,
    whole_or_none,
)
from adapters.http.requests.decoding import decode
from adapters.http.requests.responses_fields import (
    Background,
    Include,
    Metadata,
    Reasoning,
    ServiceTier,
    StreamOptions,
    TextSettings,
    Truncation,
    chat_tool,
    chat_tool_choice,
    response_format,
    text_format,
)
from adapters.http.requests.responses_input import input_messages
from adapters.http.requests.responses_logprobs import logprob_ask
from adapters.http.requests.sampling import Generating, sampling_params
from domain.common.errors import InvalidRequestError
from domain.requests.api_request import ApiRequest, Prompt
from domain.responses.objects import ResponseSettings
from domain.structured.rules import StructuredAsk, resolve_structure
from ports.response_store import ResponseStorage
from ports.tokenizer import Tokenizer

# Rules shared with chat name chat's fields; a Responses 400 names the field it was sent as.
_RESPONSES_NAMES = {"max_tokens": "max_output_tokens", "response_format": "text"}


class ResponsesBody(Generating, frozen=True, forbid_unknown_fields=True):
    """OpenAI's fields that change what is generated or returned, those that name the caller
    (`user`, `safety_identifier`, `prompt_cache_key`) and the neutral ones, with the model,
    `stream`, and vLLM's sampling and output extras as chat takes them."""

    input: (
        Annotated[
            str | list[Any],
            Meta(description="a string of valid Unicode or a non-empty list of items"),
        ]
        | None
    ) = None
    instructions: Text | None = None
    max_output_tokens: TokenBudget | None = None
    tools: Objects | None = None
    tool_choice: Any = None
    parallel_tool_calls: Flag | None = None
    include: Include | None = None
    top_logprobs: Integer | None = None
    stream_options: Annotated[StreamOptions, Meta(description="an object")] | None = None
    store: Flag | None = None
    previous_response_id: Text | None = None
    metadata: Metadata | None = None
    text: Annotated[TextSettings, Meta(description="an object")] | None = None
    reasoning: Annotated[Reasoning, Meta(description="an object")] | None = None
    user: Text | None = None
    safety_identifier: Text | None = None
    prompt_cache_key: Text | None = None
    background: Background | None = None
    truncation: Truncation | None = None
    service_tier: ServiceTier | None = None


@dataclass(frozen=True, slots=True)
class ResponsesJob:
    """A Responses request: what the engine generates, what the response echoes, and the
    conversation (without instructions) that a follow-up continues."""

    api: ApiRequest
    settings: ResponseSettings
    conversation: tuple[dict, ...]


def responses_request(
    raw: bytes, tokenizer: Tokenizer, store: ResponseStorage, *, auto_tool_choice: bool = False
) -> ResponsesJob:
    """`auto_tool_choice`: the server parses tool calls (`--enable-auto-tool-choice`)."""
    body = decode(raw, ResponsesBody)
    ask = logprob_ask(
        body.include, body.top_logprobs, body.logprob_token_ids, stream=bool(body.stream)
    )
    previous_id = body.previous_response_id
    if body.input is None:
        raise InvalidRequestError("`input` is required", param="input")
    conversation = _previous(previous_id, store) + input_messages(body.input)
    instructions = body.instructions
    system = [{"role": "system", "content": instructions}] if instructions else []
    try:
        text = tokenizer.apply_chat_template(system + conversation, add_generation_prompt=True)
    except ValueError as error:
        raise InvalidRequestError(f"the chat template failed: {error}", param="input") from None
    prompt = Prompt(tuple(tokenizer.encode(text, add_special_tokens=False)), text)
    max_tokens = whole_or_none(body.max_output_tokens)
    tools = body.tools or []
    tool_choice = body.tool_choice
    echoed_format = text_format(body.text)
    parallel = body.parallel_tool_calls is not False
    structured = StructuredAsk(
        response_format=response_format(echoed_format),
        structured_outputs=body.structured_outputs,
        tools=tuple(chat_tool(tool, index) for index, tool in enumerate(tools)) or None,
        tool_choice=chat_tool_choice(tool_choice),
        parallel_tool_calls=parallel,
        auto_tool_choice=auto_tool_choice,
    )
    params = sampling_params(body, max_tokens)
    api = ApiRequest(
        model=body.model,
        prompts=(prompt,),
        params=params,
        max_tokens=max_tokens,
        logprob_ask=ask,
        return_tokens_as_token_ids=bool(body.return_tokens_as_token_ids),
        structure=resolve_structure(structured),
        cache_salt=body.cache_salt,
    )
    settings = ResponseSettings(
        instructions=instructions,
        max_output_tokens=max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        tools=tuple(tools),
        tool_choice=tool_choice if tool_choice is not None else ("auto" if tools else "none"),
        parallel_tool_calls=parallel,
        metadata=dict(body.metadata or {}),
        previous_response_id=previous_id,
        store=body.store is not False,
        text_format=echoed_format,
        reasoning_effort=None if body.reasoning is None else body.reasoning.effort,
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


def _previous(response_id: str | None, store: ResponseStorage) -> list[dict]:
    if response_id is None:
        return []
    stored = store.get(response_id)
    if stored is None:
        raise InvalidRequestError(
            f"Previous response with id {response_id!r} not found: it was never stored "
            "(`store: false`), or this server has let it go (it keeps the most recent ones)",
            param="previous_response_id",
        )
    return [dict(message) for message in stored.conversation]
