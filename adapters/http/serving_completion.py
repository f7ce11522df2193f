"""`POST /v1/completions`: text and token-ID prompts, batches, echo, n, streaming."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import falcon.asgi
from falcon.asgi import SSEvent

from adapters.http import generation, wire_json
from adapters.http.body import PostEndpoint
from adapters.http.engine_bridge import RequestGroup, check_all
from adapters.http.requests.completion import completion_request
from adapters.http.serving import ServedModel
from adapters.http.sse import done_event, json_event
from adapters.http.streaming import stream_chunks
from domain.emission.outputs import ChoiceDelta, LogprobEntry, PromptScores, Usage
from domain.logprobs.prompt_scores import PromptScore
from domain.presentation.logprobs import (
    TokenRendering,
    completion_logprobs,
    echo_logprobs,
    join_completion_logprobs,
    prompt_offsets,
    vllm_prompt_logprobs,
)
from domain.presentation.objects import (
    ChoiceResult,
    ResponseHeader,
    completion_choice,
    completion_chunk,
    completion_response,
    usage_chunk,
)
from domain.requests.api_request import ApiRequest
from domain.requests.engine_request import EngineRequest
from ports.tokenizer import Tokenizer


class CompletionsResource(PostEndpoint):
    async def respond(self, served: ServedModel, raw: bytes, resp: falcon.asgi.Response) -> None:
        job = completion_request(raw, served.tokenizer)
        header = generation.start(job, served, "cmpl")
        if not job.generates and not job.scores_prompt:
            await check_all(
                served.engine,
                [
                    EngineRequest(
                        f"{header.id}-{index}",
                        prompt.token_ids,
                        job.params,
                        job.n,
                        job.logprob_ask,
                        grammar=job.structure.grammar,
                    )
                    for index, prompt in enumerate(job.prompts)
                ],
            )
            result = _echo_only(job)
            if job.stream:
                resp.sse = _echo_only_events(header, job, result)
            else:
                usage = generation.prompt_usage(job)
                wire_json.send(resp, completion_response(header, result, usage))
            return
        group = await generation.request_group(job, served, header, self._settings.channel_capacity)
        view = _LogprobView(job, generation.rendering(job, served), served.tokenizer)
        if job.stream:
            resp.sse = _stream(header, job, group, view)
            return
        collected = await generation.collect(group, job)
        body = []
        for choice in collected.choices:
            prompt_index = choice.index // job.n
            scores = collected.prompt_scores[prompt_index]
            body.append(
                completion_choice(
                    choice,
                    prefix=_echo_prefix(job, choice.index),
                    logprobs=view.choice(choice.index, choice.logprobs, scores),
                    prompt_logprobs=view.prompt_logprobs(prompt_index, scores),
                )
            )
        wire_json.send(resp, completion_response(header, body, collected.usage))


class _LogprobView:
    """A completion request's logprob objects: generated entries, echoed prompt entries and
    vLLM's `prompt_logprobs`, with each prompt's part built once for all its choices."""

    def __init__(self, job: ApiRequest, rendering: TokenRendering, tokenizer: Tokenizer) -> None:
        self._job = job
        # Read once: `job.logprobs` builds (and checks) the options on each read.
        self._options = job.logprobs
        self._rendering = rendering
        self._tokenizer = tokenizer
        self._echoed: dict[int, dict] = {}
        self._listed: dict[int, list] = {}

    def choice(
        self,
        index: int,
        entries: Sequence[LogprobEntry],
        scores: Sequence[PromptScore],
        *,
        with_prompt: bool = True,
    ) -> dict | None:
        """`choices[index].logprobs` (or a chunk's); with echo the prompt's entries lead (in a
        stream, in the choice's first chunk only) and generated text offsets follow the echoed
        prompt text."""
        job, options = self._job, self._options
        if options is None:
            return None
        base = len(_echo_prefix(job, index))
        generated = completion_logprobs(entries, options, self._rendering, offset_base=base)
        if not (job.echoes_logprobs and with_prompt):
            return generated
        return join_completion_logprobs(self._echo(index // job.n, scores), generated)

    def _echo(self, prompt: int, scores: Sequence[PromptScore]) -> dict:
        if prompt not in self._echoed:
            token_ids, text = self._job.prompts[prompt].token_ids, self._job.prompts[prompt].text
            self._echoed[prompt] = echo_logprobs(
                token_ids,
                scores,
                self._job.logprob_ask.count or 0,
                self._rendering,
                prompt_offsets(token_ids, self._tokenizer, text),
            )
        # Lists are fresh per choice: the JSON encoder and later joins never share them.
        return {key: list(value) for key, value in self._echoed[prompt].items()}

    def prompt_logprobs(self, prompt: int, scores: Sequence[PromptScore]) -> list | None:
        job = self._job
        if job.prompt_logprobs is None:
            return None
        if prompt not in self._listed:
            self._listed[prompt] = vllm_prompt_logprobs(
                job.prompts[prompt].token_ids, scores, job.prompt_logprobs, self._rendering
            )
        return self._listed[prompt]


def _echo_prefix(job: ApiRequest, index: int) -> str:
    return job.prompts[index // job.n].text if job.echo else ""


def _echo_only(job: ApiRequest) -> list[dict]:
    choices = []
    for index in range(len(job.prompts) * job.n):
        choice = ChoiceResult(index, finish_reason="length")
        choices.append(completion_choice(choice, prefix=_echo_prefix(job, index)))
    return choices


async def _echo_only_events(
    header: ResponseHeader, job: ApiRequest, choices: list[dict]
) -> AsyncIterator[SSEvent]:
    for choice in choices:
        yield json_event(completion_chunk(header, choice["index"], choice["text"], "length"))
    if job.include_usage:
        yield json_event(usage_chunk(header, generation.prompt_usage(job), chat=False))
    yield done_event()


def _stream(
    header: ResponseHeader, job: ApiRequest, group: RequestGroup, view: _LogprobView
) -> AsyncIterator[SSEvent]:
    scores: dict[int, list[PromptScore]] = {}
    started: set[int] = set()

    def keep(prompt: int, published: PromptScores) -> None:
        scores.setdefault(prompt, []).extend(published.scores)

    def build(index: int, delta: ChoiceDelta, text: str, usage: Usage | None) -> dict:
        first = index not in started
        started.add(index)
        prompt_scores = scores.get(index // job.n, [])
        logprobs = view.choice(index, delta.logprobs, prompt_scores, with_prompt=first)
        return completion_chunk(
            header, index, text, delta.finish_reason, delta.stop_reason, usage, logprobs
        )

    return stream_chunks(
        header,
        job,
        group,
        build,
        chat=False,
        prefix=lambda index: _echo_prefix(job, index),
        on_scores=keep,
    )
