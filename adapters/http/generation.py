"""Shared steps of completion and chat requests: engine requests, choice numbering, collection."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from adapters.http.engine_bridge import RequestGroup
from adapters.http.logprob_json import LogprobJson
from adapters.http.serving import ServedModel
from domain.common.errors import InvalidRequestError, RequestFailedError
from domain.emission.outputs import ChoiceDelta, PromptScores, RequestEnd, Usage
from domain.logprobs.prompt_scores import PromptScore
from domain.presentation.logprobs import TokenRendering
from domain.presentation.objects import ChoiceResult, ResponseHeader
from domain.reasoning.thinking import ThinkingBudget
from domain.requests.api_request import ApiRequest
from domain.requests.engine_request import EngineRequest


def start(job: ApiRequest, served: ServedModel, prefix: str) -> ResponseHeader:
    """Checks the model name and stamps the response header."""
    served.check_model(job.model)
    return ResponseHeader(f"{prefix}-{uuid.uuid4().hex}", int(time.time()), served.name)


async def request_group(
    job: ApiRequest, served: ServedModel, header: ResponseHeader, capacity: int
) -> RequestGroup:
    requests = [
        EngineRequest(
            f"{header.id}-{index}",
            prompt.token_ids,
            job.params,
            job.n,
            logprobs=job.logprob_ask,
            prefill_only=job.scores_prompt and not job.generates,
            grammar=job.structure.grammar,
            thinking=thinking_budget(job, served, prompt.text),
            cache_salt=job.cache_salt,
        )
        for index, prompt in enumerate(job.prompts)
    ]
    return await RequestGroup.checked(served.engine, requests, capacity)


def thinking_budget(job: ApiRequest, served: ServedModel, prompt: str) -> ThinkingBudget | None:
    """How the choices of `prompt` (its templated text) reason: the thinking budget over the
    served reasoning markers, with the reasoning parser's reading of where the output begins.

    A grammar on a server with a reasoning parser needs the reading even without a budget, so
    that it starts after the reasoning. A budget on a server without a reasoning parser or
    `--reasoning-config` is a 400, as vLLM refuses it.
    """
    markers = served.thinking_markers
    parsers = served.parsers
    grammar = job.structure.grammar is not None
    if job.thinking_token_budget is None:
        if not grammar or markers is None or not parsers.grammar_waits(prompt):
            return None
    elif markers is None:
        raise InvalidRequestError(
            "thinking_token_budget needs a server started with --reasoning-parser or "
            "--reasoning-config",
            param="thinking_token_budget",
        )
    # Without a parser, or with a grammar that constrains the first token (and so owns the
    # whole output), the tokens alone decide the blocks and nothing is forced into a grammar.
    owned = grammar and not parsers.grammar_waits(prompt)
    opened: bool | None = None
    if parsers.reasoning_parser is not None and not owned:
        opened = parsers.begins_in_reasoning(prompt)
    return ThinkingBudget(job.thinking_token_budget, markers, opened)


@dataclass(frozen=True, slots=True)
class Event:
    """One item of a request group, numbered as the response numbers choices."""

    prompt: int
    choice: int
    delta: ChoiceDelta | None = None
    end: RequestEnd | None = None
    scores: PromptScores | None = None


async def events(group: RequestGroup, n: int) -> AsyncIterator[Event]:
    """Choice index = prompt index * n + choice index, as vLLM numbers batched prompts.

    A request that failed raises: a 400 naming the field when its own input failed while it
    ran (`RequestEnd.error_param`), else a 500.
    """
    async for prompt, item in group.items():
        if isinstance(item, RequestEnd):
            if item.error is not None and item.error_param is not None:
                raise InvalidRequestError(item.error, param=item.error_param)
            if item.error is not None:
                raise RequestFailedError(item.error)
            yield Event(prompt, -1, end=item)
        elif isinstance(item, PromptScores):
            yield Event(prompt, -1, scores=item)
        else:
            yield Event(prompt, prompt * n + item.index, delta=item)


@dataclass(frozen=True, slots=True)
class Collected:
    """A non-streaming request's whole choices in index order, summed usage, and per prompt
    its published scores (positions 1.. in order; empty when the prompt was not scored)."""

    choices: list[ChoiceResult]
    usage: Usage
    prompt_scores: list[list[PromptScore]]


async def collect(group: RequestGroup, job: ApiRequest) -> Collected:
    choices = [ChoiceResult(index) for index in range(len(job.prompts) * job.n)]
    scores: list[list[PromptScore]] = [[] for _ in job.prompts]
    usage = Usage(0, 0)
    async for event in events(group, job.n):
        if event.end is not None:
            usage += event.end.usage
        elif event.scores is not None:
            scores[event.prompt].extend(event.scores.scores)
        elif event.delta is not None:
            choices[event.choice].add(event.delta)
    return Collected(choices, usage, scores)


def rendering(job: ApiRequest, served: ServedModel) -> TokenRendering:
    """The served model's rendering of the kind the request asks for (its memo is shared)."""
    return served.renderings[job.return_tokens_as_token_ids]


def logprob_writer(job: ApiRequest, served: ServedModel) -> LogprobJson:
    """The writer of the rendering `rendering` picks (its fragments are shared)."""
    return served.logprob_writers[job.return_tokens_as_token_ids]


def prompt_usage(job: ApiRequest) -> Usage:
    """Usage of an echo-only request (max_tokens 0): the prompts, nothing generated."""
    return Usage(sum(len(p.token_ids) for p in job.prompts), 0)
