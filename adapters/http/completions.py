"""`POST /v1/completions`: text and token-ID prompts, batches, echo, n, streaming."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import falcon.asgi
from falcon.asgi import SSEvent

from adapters.http import generation
from adapters.http.body import read_json
from adapters.http.engine_bridge import RequestGroup
from adapters.http.parsing import completion_job
from adapters.http.serving import HttpSettings, ModelHolder
from adapters.http.sse import done_event, json_event
from adapters.http.streaming import stream_chunks
from domain.jobs import GenerationJob
from domain.logprob_presentation import TokenRendering, completion_logprobs
from domain.outputs import ChoiceDelta, LogprobEntry, Usage
from domain.presentation import (
    ChoiceResult,
    ResponseHeader,
    completion_choice,
    completion_chunk,
    completion_response,
    usage_chunk,
)
from domain.requests import GenerationRequest


class CompletionsResource:
    def __init__(self, holder: ModelHolder, settings: HttpSettings) -> None:
        self._holder = holder
        self._settings = settings

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        served = self._holder.served
        job = completion_job(await read_json(req, self._settings.max_body_bytes), served.tokenizer)
        header = generation.start(job, served, "cmpl")
        if not job.generates:
            for index, prompt in enumerate(job.prompts):
                served.engine.check(
                    GenerationRequest(f"{header.id}-{index}", prompt.token_ids, job.params)
                )
            result = _echo_only(job)
            if job.stream:
                resp.sse = _echo_only_events(header, job, result)
            else:
                resp.media = completion_response(header, result, generation.prompt_usage(job))
            return
        group = generation.request_group(job, served, header, self._settings.channel_capacity)
        rendering = generation.rendering(job, served)
        if job.stream:
            resp.sse = _stream(header, job, group, rendering)
            return
        choices, usage = await generation.collect(group, job)
        body = [
            completion_choice(
                c, prefix=_echo_prefix(job, c.index), logprobs=_logprobs(job, c.logprobs, rendering)
            )
            for c in choices
        ]
        resp.media = completion_response(header, body, usage)


def _logprobs(
    job: GenerationJob, entries: Sequence[LogprobEntry], rendering: TokenRendering
) -> dict | None:
    if job.logprobs is None:
        return None
    return completion_logprobs(entries, job.logprobs, rendering)


def _echo_prefix(job: GenerationJob, index: int) -> str:
    return job.prompts[index // job.n].text if job.echo else ""


def _echo_only(job: GenerationJob) -> list[dict]:
    choices = []
    for index in range(len(job.prompts) * job.n):
        choice = ChoiceResult(index, finish_reason="length")
        choices.append(completion_choice(choice, prefix=_echo_prefix(job, index)))
    return choices


async def _echo_only_events(
    header: ResponseHeader, job: GenerationJob, choices: list[dict]
) -> AsyncIterator[SSEvent]:
    for choice in choices:
        yield json_event(completion_chunk(header, choice["index"], choice["text"], "length"))
    if job.include_usage:
        yield json_event(usage_chunk(header, generation.prompt_usage(job), chat=False))
    yield done_event()


def _stream(
    header: ResponseHeader, job: GenerationJob, group: RequestGroup, rendering: TokenRendering
) -> AsyncIterator[SSEvent]:
    def build(index: int, delta: ChoiceDelta, text: str, usage: Usage | None) -> dict:
        logprobs = _logprobs(job, delta.logprobs, rendering)
        return completion_chunk(
            header, index, text, delta.finish_reason, delta.stop_reason, usage, logprobs
        )

    return stream_chunks(
        header, job, group, build, chat=False, prefix=lambda index: _echo_prefix(job, index)
    )
