"""The SSE body shared by completions and chat: one chunk per released delta, usage, `[DONE]`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable

from falcon.asgi import SSEvent

from adapters.http.engine_bridge import RequestGroup
from adapters.http.generation import events
from adapters.http.sse import done_event, error_event, json_event
from domain.common.errors import DomainError
from domain.emission.outputs import ChoiceDelta, PromptScores, Usage
from domain.presentation.objects import ResponseHeader, usage_chunk
from domain.requests.api_request import ApiRequest

# (choice index, delta, text to send, usage so far or None) -> the chunk's wire object, or None
# when the delta has nothing to send after all (an output parser holding its text back)
ChunkBuilder = Callable[[int, ChoiceDelta, str, Usage | None], dict | None]


async def stream_chunks(
    header: ResponseHeader,
    job: ApiRequest,
    group: RequestGroup,
    build: ChunkBuilder,
    *,
    chat: bool,
    opening: Callable[[Usage | None], Iterable[dict]] = lambda usage: (),
    prefix: Callable[[int], str] = lambda index: "",
    on_scores: Callable[[int, PromptScores], None] = lambda prompt, scores: None,
) -> AsyncIterator[SSEvent]:
    """Deltas with nothing to say are skipped; `prefix(i)` starts choice i's first chunk.

    `opening(usage)` gives the frames sent before any delta (chat's role chunks); `usage` is
    the usage so far (no completion tokens yet) under continuous usage stats, else None, since
    there every chunk carries it.

    Prompt scores go to `on_scores(prompt index, scores)`; they all arrive before any choice
    of their prompt outputs anything.

    A failure after the stream started arrives as an error frame, then `[DONE]`.
    """
    prompt_tokens = sum(len(prompt.token_ids) for prompt in job.prompts)
    for frame in opening(Usage(prompt_tokens, 0) if job.continuous_usage else None):
        yield json_event(frame)
    started: set[int] = set()
    completion_tokens = cached_tokens = 0
    try:
        async for event in events(group, job.n):
            if event.end is not None:
                cached_tokens += event.end.usage.cached_tokens
            if event.scores is not None:
                on_scores(event.prompt, event.scores)
                continue
            delta = event.delta
            if delta is None:
                continue
            completion_tokens += len(delta.token_ids)
            text = delta.text
            if event.choice not in started:
                started.add(event.choice)
                text = prefix(event.choice) + text
            if not text and not delta.finished and not delta.logprobs:
                continue
            usage = (
                Usage(prompt_tokens, completion_tokens, cached_tokens)
                if job.continuous_usage
                else None
            )
            chunk = build(event.choice, delta, text, usage)
            if chunk is not None:
                yield json_event(chunk)
    except DomainError as error:
        yield error_event(error)
        yield done_event()
        return
    if job.include_usage:
        usage = Usage(prompt_tokens, completion_tokens, cached_tokens)
        yield json_event(usage_chunk(header, usage, chat=chat))
    yield done_event()
