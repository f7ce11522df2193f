"""`POST /v1/responses` and `GET /v1/responses/{id}`: the Responses API over the chat template."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence

import falcon
import falcon.asgi
from falcon.asgi import SSEvent

from adapters.http import generation
from adapters.http.body import PostEndpoint
from adapters.http.engine_bridge import RequestGroup
from adapters.http.requests.responses import ResponsesJob, responses_names, responses_request
from adapters.http.requests.responses_input import output_messages
from adapters.http.serving import HttpSettings, ModelHolder, ServedModel
from domain.common.errors import DomainError, NotFoundError
from domain.common.wire import JsonObject
from domain.emission.outputs import LogprobEntry, Usage
from domain.parsers.build import choice_parser
from domain.parsers.parsed import ChoiceParser, ParserConfig
from domain.presentation.logprobs import chat_logprobs
from domain.presentation.objects import ResponseHeader
from domain.responses.assembler import EntryRenderer, ResponseAssembler
from domain.responses.store import StoredResponse
from ports.response_store import ResponseStorage


class ResponsesResource(PostEndpoint):
    """Creates responses (one choice each) and returns stored ones."""

    def __init__(self, holder: ModelHolder, settings: HttpSettings, store: ResponseStorage) -> None:
        super().__init__(holder, settings)
        self._own_store = store

    @property
    def _store(self) -> ResponseStorage:
        """The served model's store where it has one (several API processes), else this app's."""
        served = self._holder.served
        return served.responses if served.responses is not None else self._own_store

    async def respond(self, served: ServedModel, raw: bytes, resp: falcon.asgi.Response) -> None:
        header = ResponseHeader(f"resp_{uuid.uuid4().hex}", int(time.time()), served.name)
        with responses_names():
            job = responses_request(
                raw, served.tokenizer, self._store, auto_tool_choice=served.parsers.auto_tool_choice
            )
            served.check_model(job.api.model)
            capacity = self._settings.channel_capacity
            group = await generation.request_group(job.api, served, header, capacity)
        assembler = ResponseAssembler(header, job.settings, entries=_renderer(job, served))
        parser = choice_parser(0, _parser_config(job, served))
        if job.api.stream:
            resp.sse = self._stream(job, group, assembler, parser)
            return
        usage = Usage(0, 0)
        async for event in generation.events(group, 1):
            if event.end is not None:
                usage = event.end.usage
            elif event.delta is not None:
                assembler.feed(parser.feed(event.delta))
        assembler.finish(usage)
        resp.media = self._keep(job, assembler.response())

    async def on_get_item(
        self, req: falcon.asgi.Request, resp: falcon.asgi.Response, response_id: str
    ) -> None:
        stored = self._store.get(response_id)
        if stored is None:
            raise NotFoundError(
                f"Response with id {response_id!r} not found: it was never stored "
                "(`store: false`), or this server has let it go (it keeps the most recent ones)",
                param="response_id",
            )
        resp.content_type = falcon.MEDIA_JSON
        resp.data = stored.body

    async def _stream(
        self,
        job: ResponsesJob,
        group: RequestGroup,
        assembler: ResponseAssembler,
        parser: ChoiceParser,
    ) -> AsyncIterator[SSEvent]:
        """A failure after the stream started ends it with `response.failed`."""
        for event in assembler.start():
            yield _sse(event)
        usage = Usage(len(job.api.prompts[0].token_ids), 0)
        try:
            async for item in generation.events(group, 1):
                if item.end is not None:
                    usage = item.end.usage
                elif item.delta is not None:
                    usage += Usage(0, len(item.delta.token_ids))
                    for event in assembler.feed(parser.feed(item.delta)):
                        yield _sse(event)
        except DomainError as error:
            for event in assembler.fail(error.message, usage):
                yield _sse(event)
            return
        final = assembler.finish(usage)
        # Kept before the final event goes out: a client may leave as soon as it has it, and
        # code after the last yield would then never run.
        self._keep(job, assembler.response())
        for event in final:
            yield _sse(event)

    def _keep(self, job: ResponsesJob, response: JsonObject) -> JsonObject:
        """Stores a finished response when asked to (`store`, on by default)."""
        if job.settings.store:
            conversation = [*job.conversation, *output_messages(response["output"])]
            body = json.dumps(response, ensure_ascii=False).encode()
            self._store.put(response["id"], StoredResponse.of(body, conversation))
        return response


def _sse(event: JsonObject) -> SSEvent:
    """Responses frames name their event type, as OpenAI sends them; no `[DONE]` follows."""
    return SSEvent(event=event["type"], json=event)


def _renderer(job: ResponsesJob, served: ServedModel) -> EntryRenderer | None:
    options = job.api.logprobs
    if options is None:
        return None
    rendering = generation.rendering(job.api, served)

    def render(entries: Sequence[LogprobEntry]) -> list[JsonObject]:
        return list(chat_logprobs(entries, options, rendering)["content"])

    return render


def _parser_config(job: ResponsesJob, served: ServedModel) -> ParserConfig:
    """The server's parsers; tool calls are parsed only under auto tool choice, and a forced
    tool call's content is its calls."""
    structure = job.api.structure
    return served.parsers.config(
        tools=structure.auto_tools, prompt=job.api.prompts[0].text, forced=structure.tool_calls
    )
