"""Wire objects of the Responses API: the response, its output items, usage, and the settings
it echoes (shapes of the official openai client's `types.responses`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from domain.common.wire import JsonObject
from domain.emission.outputs import Usage
from domain.presentation.objects import ResponseHeader


@dataclass(frozen=True, slots=True)
class ResponseSettings:
    """What a Responses request set, as every response object of it repeats them. `tools` and
    `tool_choice` are in the Responses spelling; `text_format` is `text.format`."""

    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    tools: tuple[JsonObject, ...] = ()
    tool_choice: str | JsonObject = "auto"
    parallel_tool_calls: bool = True
    metadata: Mapping[str, str] = field(default_factory=dict)
    previous_response_id: str | None = None
    store: bool = True
    text_format: JsonObject = field(default_factory=lambda: {"type": "text"})
    reasoning_effort: str | None = None
    top_logprobs: int = 0


@dataclass(frozen=True, slots=True)
class ResponseEnd:
    """How a response ended: `status` is completed, incomplete or failed."""

    status: str
    usage: Usage
    reasoning_tokens: int = 0
    incomplete_reason: str | None = None
    error: str | None = None


def response_object(
    header: ResponseHeader,
    settings: ResponseSettings,
    output: list[JsonObject],
    end: ResponseEnd | None = None,
) -> JsonObject:
    """The response; without `end` it is still in progress (no usage yet)."""
    return {
        "id": header.id,
        "object": "response",
        "created_at": header.created,
        "status": "in_progress" if end is None else end.status,
        "model": header.model,
        "output": output,
        "usage": None if end is None else response_usage(end),
        "incomplete_details": _incomplete(end),
        "error": _error(end),
        "instructions": settings.instructions,
        "max_output_tokens": settings.max_output_tokens,
        "temperature": settings.temperature,
        "top_p": settings.top_p,
        "top_logprobs": settings.top_logprobs,
        "tools": list(settings.tools),
        "tool_choice": settings.tool_choice,
        "parallel_tool_calls": settings.parallel_tool_calls,
        "metadata": dict(settings.metadata),
        "previous_response_id": settings.previous_response_id,
        "store": settings.store,
        "text": {"format": settings.text_format},
        "reasoning": {"effort": settings.reasoning_effort, "summary": None},
        "truncation": "disabled",
        "background": False,
        "service_tier": "default",
        "user": None,
    }


def _incomplete(end: ResponseEnd | None) -> JsonObject | None:
    if end is None or end.incomplete_reason is None:
        return None
    return {"reason": end.incomplete_reason}


def _error(end: ResponseEnd | None) -> JsonObject | None:
    if end is None or end.error is None:
        return None
    return {"code": "server_error", "message": end.error}


def response_usage(end: ResponseEnd) -> JsonObject:
    """Token counts, with the input tokens read from the prefix cache."""
    usage = end.usage
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": end.reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


def output_text_part(text: str, logprobs: list[JsonObject]) -> JsonObject:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


def reasoning_part(text: str) -> JsonObject:
    return {"type": "reasoning_text", "text": text}
