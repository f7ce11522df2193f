"""`POST /v1/chat/completions`: the model's chat template, n choices, streaming deltas."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import AsyncIterator, Sequence

import falcon.asgi
from falcon.asgi import SSEvent

from adapters.http import generation, wire_json
from adapters.http.body import PostEndpoint
from adapters.http.engine_bridge import RequestGroup
from adapters.http.logprob_json import LogprobJson
from adapters.http.requests.chat import chat_request
from adapters.http.serving import ServedModel
from adapters.http.streaming import stream_chunks
from domain.common.wire import JsonObject, JsonText
from domain.emission.outputs import ChoiceDelta, LogprobEntry, Usage
from domain.logprobs.values import LogprobOptions
from domain.parsers.build import choice_parser
from domain.parsers.forced import whole_forced_answer
from domain.parsers.parsed import ParserConfig
from domain.presentation.logprobs import vllm_prompt_logprobs
from domain.presentation.objects import (
    ChoiceResult,
    ResponseHeader,
    chat_choice,
    chat_chunk,
    chat_response,
    tool_finish,
)
from domain.presentation.parsed import parsed_delta, parsed_message
from domain.requests.api_request import ApiRequest


class ChatCompletionsResource(PostEndpoint):
    async def respond(self, served: ServedModel, raw: bytes, resp: falcon.asgi.Response) -> None:
        job = chat_request(raw, served.tokenizer, auto_tool_choice=served.parsers.auto_tool_choice)
        parsers = served.parsers.config(
            tools=job.structure.auto_tools,
            prompt=job.prompts[0].text,
            forced=job.structure.tool_calls,
        )
        header = generation.start(job, served, "chatcmpl")
        group = await generation.request_group(job, served, header, self._settings.channel_capacity)
        writer = generation.logprob_writer(job, served)
        if job.stream:
            if parsers.parses:
                resp.sse = _parsed_stream(header, job, group, writer, parsers)
            else:
                resp.sse = _stream(header, job, group, writer)
            return
        collected = await generation.collect(group, job)
        if parsers.parses:
            body = [_parsed_choice(c, job, writer, parsers) for c in collected.choices]
        else:
            options = job.logprobs
            body = [
                chat_choice(c, _logprobs(options, c.logprobs, writer)) for c in collected.choices
            ]
        prompt_logprobs = None
        if job.prompt_logprobs is not None:
            prompt_logprobs = vllm_prompt_logprobs(
                job.prompts[0].token_ids,
                collected.prompt_scores[0],
                job.prompt_logprobs,
                generation.rendering(job, served),
            )
        wire_json.send(resp, chat_response(header, body, collected.usage, prompt_logprobs))


def _logprobs(
    options: LogprobOptions | None, entries: Sequence[LogprobEntry], writer: LogprobJson
) -> JsonText | None:
    """`chat_logprobs` of the entries, written as JSON text (`logprob_json`); `options` is
    the request's `job.logprobs`, which streams read once rather than once a chunk."""
    if options is None:
        return None
    return writer.chat(entries, options)


def _stream(
    header: ResponseHeader, job: ApiRequest, group: RequestGroup, writer: LogprobJson
) -> AsyncIterator[SSEvent]:
    options = job.logprobs

    def build(index: int, delta: ChoiceDelta, text: str, usage: Usage | None) -> dict:
        content: dict = {"content": text} if text else {}
        logprobs = _logprobs(options, delta.logprobs, writer)
        return chat_chunk(
            header, index, content, delta.finish_reason, delta.stop_reason, usage, logprobs
        )

    return stream_chunks(
        header, job, group, build, chat=True, opening=functools.partial(_opening, header, job.n)
    )


def _parsed_choice(
    choice: ChoiceResult, job: ApiRequest, writer: LogprobJson, parsers: ParserConfig
) -> JsonObject:
    """A whole choice through the parsers: the same parse its stream would give, except that
    a forced call cut short stays content (a stream has sent its pieces as calls by then)."""
    whole = ChoiceDelta(
        choice.index,
        choice.text,
        tuple(choice.token_ids),
        choice.finish_reason,
        choice.stop_reason,
        tuple(choice.logprobs),
    )
    parsed = choice_parser(choice.index, dataclasses.replace(parsers, forced=None)).feed(whole)
    if parsers.forced is not None:
        parsed = whole_forced_answer(parsed, parsers.forced)
    return {
        "index": choice.index,
        "message": parsed_message(parsed, reasoning=parsers.reasoning_parser is not None),
        "logprobs": _logprobs(job.logprobs, parsed.content_logprobs, writer),
        "finish_reason": tool_finish(parsed.finish_reason, bool(parsed.tool_calls)),
        "stop_reason": parsed.stop_reason,
    }


def _parsed_stream(
    header: ResponseHeader,
    job: ApiRequest,
    group: RequestGroup,
    writer: LogprobJson,
    parsers: ParserConfig,
) -> AsyncIterator[SSEvent]:
    """Each choice's deltas through its parser; a delta whose text is all held back sends
    nothing, and the entries of content travel in the chunk that carries their text."""
    choices = {index: choice_parser(index, parsers) for index in range(job.n)}
    called: set[int] = set()
    options = job.logprobs

    def build(index: int, delta: ChoiceDelta, text: str, usage: Usage | None) -> dict | None:
        parsed = choices[index].feed(delta)
        if parsed.tool_calls:
            called.add(index)
        if parsed.empty and not parsed.content_logprobs:
            return None
        logprobs = _logprobs(options, parsed.content_logprobs, writer)
        finish = tool_finish(parsed.finish_reason, index in called)
        return chat_chunk(
            header, index, parsed_delta(parsed), finish, parsed.stop_reason, usage, logprobs
        )

    return stream_chunks(
        header, job, group, build, chat=True, opening=functools.partial(_opening, header, job.n)
    )


def _opening(header: ResponseHeader, n: int, usage: Usage | None) -> list[dict]:
    """Each choice's first chunk: the assistant role with empty content, as vLLM sends it,
    with the usage so far under continuous usage stats."""
    role = {"role": "assistant", "content": ""}
    return [chat_chunk(header, index, role, usage=usage) for index in range(n)]
