"""What a request's consumer receives: per-choice deltas, then the end with usage."""

from __future__ import annotations

from dataclasses import dataclass

from domain.common.frozen import quick_init
from domain.logprobs.prompt_scores import PromptScore
from domain.logprobs.values import PositionLogprobs


@quick_init
@dataclass(frozen=True, slots=True)
class ChoiceDelta:
    """New text and tokens of one choice; `finish_reason` is set on its last delta only.

    `text_offsets` are the text offsets of the choice's tokens, in order, each released with
    its token's first character as entries are (contracts/api.md, "Text offsets"): over all of
    a choice's deltas there is one per token of `token_ids`, but one delta's offsets may
    belong to tokens of an earlier delta. Unlike entries' offsets, every token has one, so
    parsers can attribute tokens to parts without logprobs.
    """

    index: int
    text: str = ""
    token_ids: tuple[int, ...] = ()
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: tuple[LogprobEntry, ...] = ()
    text_offsets: tuple[int, ...] = ()

    def merge(self, later: ChoiceDelta) -> ChoiceDelta:
        """One delta with the content of both, as if the consumer had read them together."""
        if later.index != self.index:
            raise ValueError("only deltas of the same choice merge")
        return ChoiceDelta(
            self.index,
            self.text + later.text,
            self.token_ids + later.token_ids,
            later.finish_reason,
            later.stop_reason,
            self.logprobs + later.logprobs,
            self.text_offsets + later.text_offsets,
        )

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True, slots=True)
class PromptScores:
    """Newly published prompt scores of a request: `scores[i]` is position `first_position + i`.

    Position 0 has no score; the engine publishes positions in order, each exactly once, before
    the generated tokens of the same step.
    """

    first_position: int
    scores: tuple[PromptScore, ...]

    def __post_init__(self) -> None:
        if self.first_position < 1:
            raise ValueError(f"prompt position {self.first_position} has no score")

    def merge(self, later: PromptScores) -> PromptScores:
        if later.first_position != self.first_position + len(self.scores):
            raise ValueError("only consecutive prompt scores merge")
        return PromptScores(self.first_position, self.scores + later.scores)


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens a request's prompts hold and its choices generated; `cached_tokens` of the prompt
    tokens were read from the prefix cache instead of computed."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.cached_tokens + other.cached_tokens,
        )

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class RequestEnd:
    """The last item of a request's channel; `error` is set when the request failed.

    `error_param` (with `error`) names the request field whose value made the request fail
    while it ran (its output constraint): the failure is the request's own bad input, a 400
    when nothing was sent yet, not a server error.
    """

    usage: Usage
    error: str | None = None
    error_param: str | None = None


@quick_init
@dataclass(frozen=True, slots=True)
class LogprobEntry:
    """The logprobs of one emitted token, with the character offset of its text in the choice."""

    position: PositionLogprobs
    text_offset: int
