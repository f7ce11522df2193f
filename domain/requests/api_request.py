"""What a completion or chat call asked the API for: prompts, sampling, choices, presentation."""

from __future__ import annotations

from dataclasses import dataclass

from domain.cache.salt import check_cache_salt
from domain.common.errors import InvalidRequestError
from domain.common.ranges import CHOICES, COMPLETION_MAX_TOKENS, TOKEN_ID
from domain.logprobs.rules import NO_LOGPROBS_ASKED, LogprobAsk
from domain.logprobs.values import LogprobOptions
from domain.reasoning.thinking import THINKING_BUDGET
from domain.requests.sampling import SamplingParams
from domain.structured.rules import StructuredOutput

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
class ApiRequest:
    """A completion or chat request as the API received it, before it becomes engine requests
    (one `EngineRequest` per prompt).

    `max_tokens == 0` is only valid with `echo` (prompt only, nothing generated). Echo with
    `logprobs`, or `prompt_logprobs`, scores the prompt. `echo` and `stream` are read from the
    logprob ask, where they change which logprob requests are valid.
    """

    model: str | None
    prompts: tuple[Prompt, ...]
    params: SamplingParams
    max_tokens: int | None
    n: int = 1
    stream_options: StreamOptions | None = None
    logprob_ask: LogprobAsk = NO_LOGPROBS_ASKED
    return_tokens_as_token_ids: bool = False
    # What `response_format`, `structured_outputs` or a forced tool call constrain the output to.
    structure: StructuredOutput = StructuredOutput()
    # vLLM's `thinking_token_budget`: reasoning tokens per block before its end is forced.
    thinking_token_budget: int | None = None
    # vLLM's `cache_salt`: only requests with the same salt share prefix-cache blocks.
    cache_salt: str | None = None

    def __post_init__(self) -> None:
        CHOICES.check(self.n, "n")
        check_cache_salt(self.cache_salt)
        if self.thinking_token_budget is not None:
            THINKING_BUDGET.check(self.thinking_token_budget, "thinking_token_budget")
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
        if self.max_tokens == 0 and not self.echo:
            raise InvalidRequestError(
                "max_tokens must be at least 1 unless echo is set", param="max_tokens"
            )

    @property
    def echo(self) -> bool:
        return self.logprob_ask.echo

    @property
    def stream(self) -> bool:
        return self.logprob_ask.stream

    @property
    def logprobs(self) -> LogprobOptions | None:
        """What each generated position reports, or None without logprobs."""
        return self.logprob_ask.options

    @property
    def prompt_logprobs(self) -> int | None:
        """vLLM's `prompt_logprobs` extra: alternatives per prompt position, or None."""
        return self.logprob_ask.prompt_logprobs

    @property
    def generates(self) -> bool:
        return self.max_tokens != 0

    @property
    def echoes_logprobs(self) -> bool:
        """Echoed prompt tokens carry logprob entries (the first one null)."""
        return self.logprob_ask.echoes

    @property
    def scores_prompt(self) -> bool:
        return self.logprob_ask.prompt_top_k is not None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.continuous_usage_stats
