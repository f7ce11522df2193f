"""A generation request as the engine accepts it: prompt token IDs, sampling settings, choices."""

from __future__ import annotations

import random
from dataclasses import dataclass

from domain.errors import InvalidRequestError
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

    def __post_init__(self) -> None:
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

    def choice_seed(self, index: int, fallback: int) -> int:
        """Seed of choice `index`: the request's seed for choice 0, mixed for the others."""
        base = fallback if self.params.seed is None else self.params.seed & _SEED_MASK
        return base if index == 0 else (base ^ (index * _SEED_MIX)) & _SEED_MASK


def fresh_seed() -> int:
    """A seed for an unseeded request."""
    return random.SystemRandom().getrandbits(63)
