"""HTTP requests translated into domain terms: what to generate and how to present it."""

from __future__ import annotations

from dataclasses import dataclass

from domain.errors import InvalidRequestError
from domain.logprobs import LogprobOptions
from domain.prompt_scores import PROMPT_ALTERNATIVES
from domain.ranges import CHOICES, COMPLETION_MAX_TOKENS, TOKEN_ID, check_logprob_count
from domain.sampling import SamplingParams

MAX_PROMPTS = 64
MAX_TOTAL_CHOICES = 128


@dataclass(frozen=True, slots=True)
class Prompt:
    """One prompt as token IDs, with the text that `echo` prepends."""

    token_ids: tuple[int, ...]
    text: str

    def __post_init__(self) -> None:
        TOKEN_ID.check_each(self.token_ids, "prompt")


@dataclass(frozen=True, slots=True)
class StreamOptions:
    include_usage: bool = False
    continuous_usage_stats: bool = False


@dataclass(frozen=True, slots=True)
class GenerationJob:
    """A completion or chat request: prompts, sampling, choices per prompt and presentation flags.

    `max_tokens == 0` is only valid with `echo` (prompt only, nothing generated). Echo with
    `logprobs`, or `prompt_logprobs`, scores the prompt.
    """

    model: str | None
    prompts: tuple[Prompt, ...]
    params: SamplingParams
    max_tokens: int | None
    n: int = 1
    echo: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: LogprobOptions | None = None
    return_tokens_as_token_ids: bool = False
    # vLLM's `prompt_logprobs` extra: alternatives per prompt position, or None.
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        CHOICES.check(self.n, "n")
        if self.max_tokens is not None:
            COMPLETION_MAX_TOKENS.check(self.max_tokens, "max_tokens")
        if not self.prompts:
            raise InvalidRequestError("the prompt must not be empty", param="prompt")
        if len(self.prompts) > MAX_PROMPTS:
            raise InvalidRequestError(f"at most {MAX_PROMPTS} prompts per request", param="prompt")
        if len(self.prompts) * self.n > MAX_TOTAL_CHOICES:
            raise InvalidRequestError(
                f"prompts times n must be at most {MAX_TOTAL_CHOICES}", param="n"
            )
        if self.stream_options is not None and not self.stream:
            raise InvalidRequestError(
                "Stream options can only be defined when `stream=True`.", param="stream_options"
            )
        if self.prompt_logprobs is not None:
            check_logprob_count(
                "prompt", self.prompt_logprobs, PROMPT_ALTERNATIVES, "prompt_logprobs"
            )
            if self.stream:
                raise InvalidRequestError(
                    "`prompt_logprobs` are not available when `stream=True`.",
                    param="prompt_logprobs",
                )
        if self.echoes_logprobs and self.logprobs.selects:
            raise InvalidRequestError(
                "`logprob_token_ids` cannot be combined with `echo`: prompt positions report "
                "natural alternatives only",
                param="logprob_token_ids",
            )
        if self.max_tokens == 0 and not self.echo:
            raise InvalidRequestError(
                "max_tokens must be at least 1 unless echo is set", param="max_tokens"
            )

    @property
    def generates(self) -> bool:
        return self.max_tokens != 0

    @property
    def echoes_logprobs(self) -> bool:
        """Echoed prompt tokens carry logprob entries (the first one null)."""
        return self.echo and self.logprobs is not None

    @property
    def scores_prompt(self) -> bool:
        return self.echoes_logprobs or self.prompt_logprobs is not None

    @property
    def prompt_top_k(self) -> int | None:
        """Alternatives each prompt position is scored for; None when the prompt is not scored.

        As in vLLM, echo with `logprobs` scores the prompt at the `logprobs` count unless
        `prompt_logprobs` says otherwise."""
        if self.prompt_logprobs is not None:
            return self.prompt_logprobs
        return self.logprobs.top_k if self.echoes_logprobs else None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.continuous_usage_stats
