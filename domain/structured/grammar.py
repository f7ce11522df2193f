"""What a structured output is constrained to: the grammar spec the engine and executors share."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from domain.common.errors import InvalidRequestError

# A spec travels in every step plan of its lanes and keys the compiled-grammar cache by content.
MAX_GRAMMAR_CHARS = 1 << 16


class GrammarKind(enum.Enum):
    """How `GrammarSpec.source` reads: a JSON schema, any JSON object, a regular expression, a
    JSON array of literal choices, or a grammar (Lark, or GBNF/EBNF with `::=` rules)."""

    JSON_SCHEMA = "json_schema"
    JSON_OBJECT = "json_object"
    REGEX = "regex"
    CHOICE = "choice"
    GRAMMAR = "grammar"


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    """One output constraint; equal specs compile to the same grammar.

    `param` is the request field it came from (`response_format`, `structured_outputs`,
    `tools`), which a 400 about it names; it is not part of the content.
    """

    kind: GrammarKind
    source: str
    param: str = field(default="structured_outputs", compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source:
            raise InvalidRequestError("the output constraint must not be empty", param=self.param)
        if len(self.source) > MAX_GRAMMAR_CHARS:
            raise InvalidRequestError(
                f"the output constraint has {len(self.source)} characters; at most "
                f"{MAX_GRAMMAR_CHARS} are allowed",
                param=self.param,
            )

    @property
    def key(self) -> tuple[str, str]:
        """What the compiled grammar depends on: the kind and the exact source text."""
        return self.kind.value, self.source
