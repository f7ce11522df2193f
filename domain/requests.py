"""A generation request as the engine accepts it: prompt token IDs, sampling settings, choices."""

from __future__ import annotations

import random
from dataclasses import dataclass

from domain.errors import InvalidRequestError
from domain.logprobs import MAX_SELECTED_IDS, NATURAL_TOP_K, LogprobOptions
from domain.sampling import SamplingParams

MAX_CHOICES = 16
_SEED_MIX = 0x9E3779B97F4A7C15
_SEED_MASK = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """What to generate; `n` choices share the prompt and differ by seed."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    n: int = 1
    logprobs: LogprobOptions | None = None
    # Prompt scoring: when set, a score for every prompt position after the first, shown with
    # this many alternatives; with `prefill_only` nothing is generated (echo, max_tokens 0).
    prompt_logprobs: int | None = None
    prefill_only: bool = False
    # The response echoes the prompt: scorers index its logprob arrays by position, so every
    # generated token keeps an entry (a terminating EOS or stop token included).
    echo: bool = False

    def __post_init__(self) -> None:
        if self.prefill_only and not self.score_prompt:
            raise ValueError("a prefill-only request must score its prompt")
        if not self.prompt_token_ids:
            raise InvalidRequestError("the prompt must contain at least one token", param="prompt")
        if (
            isinstance(self.n, bool)
            or not isinstance(self.n, int)
            or not 1 <= self.n <= MAX_CHOICES
        ):
            raise InvalidRequestError(f"n must be an integer from 1 to {MAX_CHOICES}", param="n")

    def check_limits(self, vocab_size: int, max_model_len: int) -> None:
        """Rejects prompts the model cannot take, before admission."""
        prompt_len = len(self.prompt_token_ids)
        bad = next((t for t in self.prompt_token_ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise InvalidRequestError(
                f"token ID {bad} is outside the vocabulary of {vocab_size}", param="prompt"
            )
        self.params.check_token_ids(vocab_size)
        if prompt_len >= max_model_len:
            raise InvalidRequestError(
                f"This model's maximum context length is {max_model_len} tokens; the prompt has "
                f"{prompt_len} tokens, which leaves no room to generate",
                param="prompt",
            )
        if prompt_len + self.params.min_tokens > max_model_len:
            raise InvalidRequestError(
                f"min_tokens {self.params.min_tokens} does not fit: the prompt has {prompt_len} of "
                f"the model's {max_model_len} positions",
                param="min_tokens",
            )
        max_tokens = self.params.max_tokens
        if max_tokens is not None and prompt_len + max_tokens > max_model_len:
            raise InvalidRequestError(
                f"This model's maximum context length is {max_model_len} tokens. However, you "
                f"requested {prompt_len + max_tokens} tokens ({prompt_len} in the prompt, "
                f"{max_tokens} in the completion)",
                param="max_tokens",
            )

    def check_logprobs(
        self, top_k: int, selects_ids: bool, max_logprobs: int, vocab_size: int
    ) -> None:
        """Rejects logprob requests the loaded core or the server limit cannot serve."""
        options = self.logprobs
        if options is None:
            return
        if top_k == 0:
            raise InvalidRequestError(
                "`logprobs` was requested, but the served model has no logprob outputs "
                "(allow_logprobs is false)",
                param="logprobs",
            )
        _check_count("sample", options.top_k, min(max_logprobs, top_k), "logprobs")
        ids = options.token_ids
        if not ids:
            return
        if not selects_ids:
            raise InvalidRequestError(
                "`logprob_token_ids` needs a core with selected-ID inputs; the served core "
                "reports natural alternatives only",
                param="logprob_token_ids",
            )
        if len(ids) > MAX_SELECTED_IDS:
            raise InvalidRequestError(
                f"Requested logprob_token_ids of length {len(ids)}, which is greater than max "
                f"allowed: {MAX_SELECTED_IDS}",
                param="logprob_token_ids",
            )
        if len(set(ids)) != len(ids):
            raise InvalidRequestError(
                "`logprob_token_ids` must be distinct", param="logprob_token_ids"
            )
        bad = next((t for t in ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise InvalidRequestError(
                f"logprob token ID {bad} is outside the vocabulary of {vocab_size}",
                param="logprob_token_ids",
            )

    @property
    def score_prompt(self) -> bool:
        return self.prompt_logprobs is not None

    def check_scoring(self, scores_prompts: bool, max_logprobs: int) -> None:
        """Rejects prompt scoring on an executor prepared without it, or beyond the limits."""
        if not self.score_prompt:
            return
        if not scores_prompts:
            raise InvalidRequestError(
                "prompt logprobs need prompt scoring; start the server with --prompt-logprobs "
                "(or serve a core exported with it)",
                param="prompt_logprobs",
            )
        limit = min(max_logprobs, NATURAL_TOP_K)
        _check_count("prompt", self.prompt_logprobs, limit, "prompt_logprobs")

    def choice_seed(self, index: int, fallback: int) -> int:
        """Seed of choice `index`: the request's seed for choice 0, mixed for the others."""
        base = fallback if self.params.seed is None else self.params.seed & _SEED_MASK
        return base if index == 0 else (base ^ (index * _SEED_MIX)) & _SEED_MASK


def _check_count(kind: str, count: int, limit: int, param: str) -> None:
    """vLLM's wording for an alternatives count outside 0..limit."""
    if not 0 <= count <= limit:
        raise InvalidRequestError(
            f"Requested {kind} logprobs of {count}, which is greater than max allowed: {limit}",
            param=param,
        )


def fresh_seed() -> int:
    """A seed for an unseeded request."""
    return random.SystemRandom().getrandbits(63)
