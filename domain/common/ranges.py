"""Integer ranges of request fields, checked before any rule that quotes a field's value."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from domain.common.errors import InvalidRequestError

INT32_MAX = 2**31 - 1
MAX_CHOICES = 16


@dataclass(frozen=True, slots=True)
class IntRange:
    """Inclusive bounds of an integer field.

    The 400 names the field and the bounds but not the value, which may have hundreds of digits.
    """

    low: int
    high: int

    def describe(self) -> str:
        """What a value must be, as the 400 says it (also the HTTP declarations' wording)."""
        return f"an integer from {self.low} to {self.high}"

    def check(self, value: int, param: str, *, subject: str | None = None) -> None:
        if not self.low <= value <= self.high:
            raise InvalidRequestError(
                f"{subject or f'`{param}`'} must be {self.describe()}.", param=param
            )

    def check_each(self, values: Iterable[int], param: str) -> None:
        for value in values:
            self.check(value, param, subject=f"each item of `{param}`")


# Token IDs and token counts index int32 device tensors; the vocabulary size and the model
# length bound them further, per served model.
TOKEN_ID = IntRange(0, INT32_MAX)
# Completions `max_tokens`: 0 only together with `echo`.
COMPLETION_MAX_TOKENS = IntRange(0, INT32_MAX)
# Chat `max_tokens` and `max_completion_tokens`, and the budget the engine samples to.
TOKEN_BUDGET = IntRange(1, INT32_MAX)
MIN_TOKENS = IntRange(0, INT32_MAX)
# -1 and 0 turn top-k off; a value at or above the vocabulary size keeps every token.
TOP_K = IntRange(-1, INT32_MAX)
# Signed 64 bits, as vLLM and the device's int64 seed tensor take it.
SEED = IntRange(-(2**63), 2**63 - 1)
CHOICES = IntRange(1, MAX_CHOICES)


def check_token_ids(token_ids: Iterable[int], vocab_size: int, param: str) -> None:
    """Token IDs a request names must be in the vocabulary."""
    token_ids = tuple(token_ids)
    TOKEN_ID.check_each(token_ids, param)
    bad = next((t for t in token_ids if t >= vocab_size), None)
    if bad is not None:
        raise InvalidRequestError(
            f"token ID {bad} is outside the vocabulary of {vocab_size}", param=param
        )


def check_logprob_count(kind: str, count: int, limit: int, param: str) -> None:
    """vLLM's wording for an alternatives count outside 0..limit (`kind`: sample or prompt)."""
    if count < 0:
        raise InvalidRequestError(f"`{param}` must be a positive value or 0.", param=param)
    if count > limit:
        raise InvalidRequestError(
            f"Requested {kind} logprobs of {count}, which is greater than max allowed: {limit}",
            param=param,
        )
