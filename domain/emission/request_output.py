"""What one request's consumer receives: its choices' deltas, the prompt's scores, one end."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from domain.contract.records import CompletionRecord
from domain.emission.channel import OutputChannel
from domain.emission.choice import ChoiceEmission
from domain.emission.outputs import ChoiceDelta, PromptScores, RequestEnd, Usage
from domain.logprobs.values import PositionLogprobs
from domain.requests.engine_request import EngineRequest

if TYPE_CHECKING:
    from ports.tokenizer import Tokenizer


class RequestOutput:
    """The consumer side of one request: an emission machine per choice, and the channel that
    their deltas, the prompt's scores and the request's end (its usage, and the error that
    failed it, if any) go to."""

    def __init__(
        self, request: EngineRequest, channel: OutputChannel, tokenizer: Tokenizer
    ) -> None:
        self.request = request
        self._channel = channel
        wants, echo = request.options is not None, request.logprobs.echoes
        self._choices = [
            ChoiceEmission(index, request.params, tokenizer, logprobs=wants, echo=echo)
            for index in range(request.n)
        ]

    @property
    def done(self) -> bool:
        # A loop, not `all(genexpr)`: asked twice a lane a step, the generator was 4% of the
        # engine thread at 64 lanes.
        for choice in self._choices:  # noqa: SIM110
            if not choice.finished:
                return False
        return True

    def advance(
        self, index: int, record: CompletionRecord, payload: Sequence[PositionLogprobs] | None
    ) -> ChoiceDelta:
        """Runs a record through choice `index`'s emission machine (`ChoiceEmission.advance`)."""
        return self._choices[index].advance(record, payload)

    def end(self, index: int) -> ChoiceDelta:
        """Ends choice `index`, which has nothing (more) to emit."""
        return self._choices[index].end()

    def deliver(self, item: ChoiceDelta | PromptScores) -> None:
        """Puts prompt scores, or a delta that says anything, on the channel."""
        if isinstance(item, PromptScores) or (
            item.text or item.token_ids or item.finished or item.logprobs
        ):
            self._channel.put(item)

    def stop(self, reason: str, *, tell: bool) -> list[int]:
        """Ends every unfinished choice with `reason`, telling its consumer when `tell`; returns
        their indices."""
        stopped = []
        for index, choice in enumerate(self._choices):
            if not choice.finished:
                delta = choice.abort(reason)
                if tell:
                    self._channel.put(delta)
                stopped.append(index)
        return stopped

    def close(self, error: str | None = None, param: str | None = None, cached: int = 0) -> None:
        """Ends the request with its usage, `cached` of its prompt tokens read from the prefix
        cache; `error` fails it, `param` naming its own input."""
        generated = sum(c.num_tokens for c in self._choices)
        usage = Usage(len(self.request.prompt_token_ids), generated, cached)
        self._channel.put(RequestEnd(usage, error=error, error_param=param))
