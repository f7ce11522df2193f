"""Wire objects of the OpenAI-compatible API, built from domain values; HTTP only serializes."""

from __future__ import annotations

from dataclasses import dataclass, field

from domain.common.errors import DomainError
from domain.common.wire import JsonObject, JsonText
from domain.emission.outputs import ChoiceDelta, LogprobEntry, Usage


def usage_object(usage: Usage) -> JsonObject:
    """OpenAI's usage; `prompt_tokens_details` only when some prompt tokens were cached, so
    that a server without cache hits answers as before (contracts/api.md, "Prefix caching")."""
    found: JsonObject = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }
    if usage.cached_tokens:
        found["prompt_tokens_details"] = {"cached_tokens": usage.cached_tokens}
    return found


def error_object(error: DomainError) -> JsonObject:
    """The OpenAI error envelope; `code` is the integer HTTP status, as vLLM sends it."""
    return {
        "error": {
            "message": error.message,
            "type": error.type,
            "param": error.param,
            "code": error.code,
        }
    }


@dataclass
class ChoiceResult:
    """A whole choice, accumulated from its deltas for a non-streaming response."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: list[LogprobEntry] = field(default_factory=list)

    def add(self, delta: ChoiceDelta) -> None:
        self.text += delta.text
        self.token_ids.extend(delta.token_ids)
        self.logprobs.extend(delta.logprobs)
        if delta.finished:
            self.finish_reason = delta.finish_reason
            self.stop_reason = delta.stop_reason


@dataclass(frozen=True, slots=True)
class ResponseHeader:
    """Fields every response object and chunk of one request repeats."""

    id: str
    created: int
    model: str


def completion_choice(
    choice: ChoiceResult,
    *,
    prefix: str = "",
    logprobs: JsonObject | JsonText | None = None,
    prompt_logprobs: list[JsonObject | None] | None = None,
) -> JsonObject:
    return {
        "index": choice.index,
        "text": prefix + choice.text,
        "logprobs": logprobs,
        "finish_reason": choice.finish_reason,
        "stop_reason": choice.stop_reason,
        "prompt_logprobs": prompt_logprobs,
    }


def completion_response(
    header: ResponseHeader, choices: list[JsonObject], usage: Usage
) -> JsonObject:
    return {
        "id": header.id,
        "object": "text_completion",
        "created": header.created,
        "model": header.model,
        "choices": choices,
        "usage": usage_object(usage),
    }


def completion_chunk(
    header: ResponseHeader,
    index: int,
    text: str,
    finish_reason: str | None = None,
    stop_reason: str | int | None = None,
    usage: Usage | None = None,
    logprobs: JsonObject | JsonText | None = None,
) -> JsonObject:
    choice = _chunk_choice(index, {"text": text}, logprobs, finish_reason, stop_reason)
    return _chunk(header, "text_completion", [choice], usage)


def _chunk_choice(
    index: int,
    body: JsonObject,
    logprobs: JsonObject | JsonText | None,
    finish_reason: str | None,
    stop_reason: str | int | None,
) -> JsonObject:
    """A stream frame's choice: its endpoint's `body` (completions' `text`, chat's `delta`)
    between the index and the fields both endpoints share."""
    return {
        "index": index,
        **body,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
    }


def _chunk(
    header: ResponseHeader, kind: str, choices: list[JsonObject], usage: Usage | None
) -> JsonObject:
    """A stream frame; `usage` appears only when given (include_usage or continuous stats)."""
    chunk = {
        "id": header.id,
        "object": kind,
        "created": header.created,
        "model": header.model,
        "choices": choices,
    }
    if usage is not None:
        chunk["usage"] = usage_object(usage)
    return chunk


def usage_chunk(header: ResponseHeader, usage: Usage, *, chat: bool) -> JsonObject:
    """The last chunk of a stream with `stream_options.include_usage`: no choices, only usage."""
    return _chunk(header, "chat.completion.chunk" if chat else "text_completion", [], usage)


def chat_choice(choice: ChoiceResult, logprobs: JsonObject | JsonText | None = None) -> JsonObject:
    """A choice as the model wrote it, all content (parsed answers and forced tool calls go
    through `domain.presentation.parsed`)."""
    return {
        "index": choice.index,
        "message": {"role": "assistant", "content": choice.text, "tool_calls": []},
        "logprobs": logprobs,
        "finish_reason": choice.finish_reason,
        "stop_reason": choice.stop_reason,
    }


def tool_finish(finish_reason: str | None, calls: bool) -> str | None:
    """A forced tool call that ended by completing (`stop`) finishes with `tool_calls`."""
    return "tool_calls" if calls and finish_reason == "stop" else finish_reason


def chat_response(
    header: ResponseHeader,
    choices: list[JsonObject],
    usage: Usage,
    prompt_logprobs: list[JsonObject | None] | None = None,
) -> JsonObject:
    """vLLM puts a chat request's `prompt_logprobs` (its one templated prompt) at the top."""
    return {
        "id": header.id,
        "object": "chat.completion",
        "created": header.created,
        "model": header.model,
        "choices": choices,
        "usage": usage_object(usage),
        "prompt_logprobs": prompt_logprobs,
    }


def chat_chunk(
    header: ResponseHeader,
    index: int,
    delta: JsonObject,
    finish_reason: str | None = None,
    stop_reason: str | int | None = None,
    usage: Usage | None = None,
    logprobs: JsonObject | JsonText | None = None,
) -> JsonObject:
    choice = _chunk_choice(index, {"delta": delta}, logprobs, finish_reason, stop_reason)
    return _chunk(header, "chat.completion.chunk", [choice], usage)


def model_list(name: str, created: int, max_model_len: int, *, allow_logprobs: bool) -> JsonObject:
    """`GET /v1/models`: the one served model, with vLLM's permission block."""
    return {
        "object": "list",
        "data": [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "helios",
                "root": name,
                "parent": None,
                "max_model_len": max_model_len,
                "permission": [
                    {
                        "id": f"modelperm-{name}",
                        "object": "model_permission",
                        "created": created,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": allow_logprobs,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
        ],
    }
