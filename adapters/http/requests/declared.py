"""The field types request bodies are declared in: what each takes and what its 400 says.

Integers may be spelled as integral floats (`2.0`), as JSON Schema and vLLM's pydantic models
take them; a builder reads them with `whole`. Each type's `description` finishes the sentence
"`field` must be ...", which `decoding` writes when a value does not fit.
"""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import Meta, Struct

from domain.common.ranges import (
    CHOICES,
    COMPLETION_MAX_TOKENS,
    MIN_TOKENS,
    SEED,
    TOKEN_BUDGET,
    TOKEN_ID,
    TOP_K,
    IntRange,
)
from domain.reasoning.thinking import THINKING_BUDGET


class Body(Struct, kw_only=True, frozen=True):
    """A request body; fields it does not declare are ignored, as vLLM ignores them."""


class StrictBody(Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """A body or member whose unknown fields are a 400 naming them (the Responses API)."""


def _says(what: str) -> Meta:
    return Meta(description=what)


def _int(bounds: IntRange) -> Meta:
    return Meta(ge=bounds.low, le=bounds.high)


def _whole(bounds: IntRange) -> Meta:
    return Meta(ge=bounds.low, le=bounds.high, multiple_of=1)


Flag = Annotated[bool, _says("a boolean")]
Number = Annotated[float, _says("a number")]
Text = Annotated[str, _says("a string of valid Unicode")]
JsonObject = Annotated[dict[str, Any], _says("an object")]
Objects = Annotated[list[dict[str, Any]], _says("a list of objects")]
Integer = Annotated[int | Annotated[float, Meta(multiple_of=1)], _says("an integer")]
TokenId = Annotated[
    Annotated[int, _int(TOKEN_ID)] | Annotated[float, _whole(TOKEN_ID)], _says(TOKEN_ID.describe())
]
TokenIds = Annotated[list[TokenId], _says("a list of integers")]
# Integers judged later, in the order of a rule that quotes their range (selected logprob IDs).
Integers = Annotated[list[Integer], _says("a list of integers")]
CompletionMaxTokens = Annotated[
    Annotated[int, _int(COMPLETION_MAX_TOKENS)] | Annotated[float, _whole(COMPLETION_MAX_TOKENS)],
    _says(COMPLETION_MAX_TOKENS.describe()),
]
TokenBudget = Annotated[
    Annotated[int, _int(TOKEN_BUDGET)] | Annotated[float, _whole(TOKEN_BUDGET)],
    _says(TOKEN_BUDGET.describe()),
]
MinTokens = Annotated[
    Annotated[int, _int(MIN_TOKENS)] | Annotated[float, _whole(MIN_TOKENS)],
    _says(MIN_TOKENS.describe()),
]
TopK = Annotated[
    Annotated[int, _int(TOP_K)] | Annotated[float, _whole(TOP_K)], _says(TOP_K.describe())
]
Seed = Annotated[
    Annotated[int, _int(SEED)] | Annotated[float, _whole(SEED)], _says(SEED.describe())
]
Choices = Annotated[
    Annotated[int, _int(CHOICES)] | Annotated[float, _whole(CHOICES)], _says(CHOICES.describe())
]
ThinkingBudget = Annotated[
    Annotated[int, _int(THINKING_BUDGET)] | Annotated[float, _whole(THINKING_BUDGET)],
    _says(THINKING_BUDGET.describe()),
]
CacheSalt = Annotated[str, Meta(min_length=1), _says("a non-empty string")]
Stop = Annotated[str | list[str], _says("a string or a list of strings, in valid Unicode")]
# Keys are ASCII decimal token IDs: int() alone would also take " 7", "+7", "1_0" and other
# scripts' digits.
LogitBias = Annotated[
    dict[Annotated[str, Meta(pattern=r"^[0-9]+\Z")], float],
    _says("an object mapping token IDs to numbers"),
]


def whole(value: int | float) -> int:
    """An integer field's value (declared integers may arrive as integral floats)."""
    return value if isinstance(value, int) else int(value)


def whole_or_none(value: int | float | None) -> int | None:
    return None if value is None else whole(value)
