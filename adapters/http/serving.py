"""What the HTTP app serves: one loaded model, held until the worker has loaded it."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from adapters.http.logprob_json import LogprobJson
from domain.common.errors import NotFoundError, NotReadyError
from domain.parsers.settings import NO_PARSERS, ParserSettings
from domain.presentation.logprobs import TokenRendering
from domain.reasoning.thinking import ThinkingMarkers
from ports.engine_client import EngineClient
from ports.response_store import ResponseStorage
from ports.tokenizer import Tokenizer


@dataclass(frozen=True)
class ServedModel:
    """A model ready to serve: its name, tokenizer and engine, the output parsers it runs, and
    how to stop it."""

    name: str
    tokenizer: Tokenizer
    engine: EngineClient
    allow_logprobs: bool = False
    parsers: ParserSettings = NO_PARSERS
    created: int = field(default_factory=lambda: int(time.time()))
    stop: Callable[[], None] = lambda: None
    # Why the model can no longer run, or None while it can (`/health` reports it).
    failure: Callable[[], str | None] = lambda: None
    # Where finished responses are kept when the app's own store is not the place (several
    # API processes keep them in the engine process), or None.
    responses: ResponseStorage | None = None

    @functools.cached_property
    def thinking_markers(self) -> ThinkingMarkers | None:
        """The thinking budget's start and end strings as token IDs, tokenized once (as vLLM
        does, without special tokens); None when the server has no reasoning parser or
        `--reasoning-config`."""
        strings = self.parsers.budget_strings
        if strings is None:
            return None
        encode = self.tokenizer.encode
        return ThinkingMarkers(
            tuple(encode(strings.start, add_special_tokens=False)),
            tuple(encode(strings.end, add_special_tokens=False)),
        )

    @functools.cached_property
    def renderings(self) -> tuple[TokenRendering, TokenRendering]:
        """How tokens are named on the wire, by their bytes and as `token_id:<id>`: one of each
        for the server's life, so every request finds the names and bytes of tokens any earlier
        request rendered (at most one entry a vocabulary token in each)."""
        token_bytes = self.tokenizer.token_bytes
        return TokenRendering(token_bytes), TokenRendering(token_bytes, as_token_ids=True)

    @functools.cached_property
    def logprob_writers(self) -> tuple[LogprobJson, LogprobJson]:
        """Chat and completions `logprobs` as JSON text, one writer per rendering, its token
        fragments kept for the server's life as the renderings keep names."""
        return LogprobJson(self.renderings[0]), LogprobJson(self.renderings[1])

    def check_model(self, name: str | None) -> None:
        """A request may name the served model or none; any other name is a 404, as in vLLM."""
        if name is not None and name != self.name:
            raise NotFoundError(f"The model `{name}` does not exist.", param="model")


@dataclass(frozen=True, slots=True)
class HttpSettings:
    """Front-end limits and access control."""

    api_key: str | None = None
    max_body_bytes: int = 8 << 20
    channel_capacity: int = 64
    # Answers carry the answering process's ID (`x-helios-api-server`): several API processes.
    name_process: bool = False


class ModelHolder:
    """Loads the model on ASGI startup (after gunicorn forks) and stops it on shutdown.

    Falcon calls `process_startup` and `process_shutdown` because the holder is registered as
    middleware. A model handed in already loaded belongs to the caller, who also stops it.
    """

    def __init__(
        self, loader: Callable[[], ServedModel] | None = None, served: ServedModel | None = None
    ) -> None:
        self._loader = loader
        self._served = served

    @property
    def loaded(self) -> bool:
        return self._served is not None

    @property
    def served(self) -> ServedModel:
        if self._served is None:
            raise NotReadyError("the model is still loading")
        return self._served

    async def process_startup(self, scope: dict, event: dict) -> None:
        if self._served is None and self._loader is not None:
            self._served = await asyncio.to_thread(self._loader)

    async def process_shutdown(self, scope: dict, event: dict) -> None:
        if self._served is not None and self._loader is not None:
            self._served.stop()
