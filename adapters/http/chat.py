"""`POST /v1/chat/completions`: the model's chat template, n choices, streaming deltas."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import falcon.asgi
from falcon.asgi import SSEvent

from adapters.http import generation
from adapters.http.body import read_json
from adapters.http.engine_bridge import RequestGroup
from adapters.http.parsing import chat_job
from adapters.http.serving import HttpSettings, ModelHolder
from adapters.http.sse import done_event, error_event, json_event
from domain.errors import DomainError
from domain.jobs import GenerationJob
from domain.logprob_presentation import TokenRendering, chat_logprobs
from domain.outputs import LogprobEntry, Usage
from domain.presentation import ResponseHeader, chat_choice, chat_chunk, chat_response, usage_chunk


class ChatCompletionsResource:
    def __init__(self, holder: ModelHolder, settings: HttpSettings) -> None:
        self._holder = holder
        self._settings = settings

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        served = self._holder.served
        job = chat_job(await read_json(req, self._settings.max_body_bytes), served.tokenizer)
        header = generation.start(job, served, "chatcmpl")
        group = generation.request_group(job, served, header, self._settings.channel_capacity)
        rendering = generation.rendering(job, served)
        if job.stream:
            resp.sse = _stream(header, job, group, rendering)
            return
        choices, usage = await generation.collect(group, job)
        body = [chat_choice(c, _logprobs(job, c.logprobs, rendering)) for c in choices]
        resp.media = chat_response(header, body, usage)


def _logprobs(
    job: GenerationJob, entries: Sequence[LogprobEntry], rendering: TokenRendering
) -> dict | None:
    if job.logprobs is None:
        return None
    return chat_logprobs(entries, job.logprobs, rendering)


async def _stream(
    header: ResponseHeader, job: GenerationJob, group: RequestGroup, rendering: TokenRendering
) -> AsyncIterator[SSEvent]:
    prompt_tokens = len(job.prompts[0].token_ids)
    completion_tokens = 0
    for index in range(job.n):
        yield json_event(chat_chunk(header, index, {"role": "assistant", "content": ""}))
    try:
        async for event in generation.events(group, job.n):
            if event.end is not None:
                continue
            delta = event.delta
            completion_tokens += len(delta.token_ids)
            if not delta.text and not delta.finished and not delta.logprobs:
                continue
            usage = Usage(prompt_tokens, completion_tokens) if job.continuous_usage else None
            content = {"content": delta.text} if delta.text else {}
            logprobs = _logprobs(job, delta.logprobs, rendering)
            yield json_event(
                chat_chunk(
                    header,
                    event.choice,
                    content,
                    delta.finish_reason,
                    delta.stop_reason,
                    usage,
                    logprobs,
                )
            )
    except DomainError as error:
        yield error_event(error)
        yield done_event()
        return
    if job.include_usage:
        yield json_event(usage_chunk(header, Usage(prompt_tokens, completion_tokens), chat=True))
    yield done_event()
