"""Structured output as a part of one choice and of its lanes: the grammar and where it starts."""

from __future__ import annotations

from dataclasses import dataclass

from domain.structured.grammar import GrammarSpec


@dataclass(frozen=True, slots=True)
class GrammarLane:
    """A constrained lane's grammar, and `start`, the position of the first token it walks.

    The lane samples every token from the grammar's allowed set (each target row of a
    speculative lane under its state after the drafts before it); the grammar walks the fed
    tokens from `start` on, then what the lane's records emit.
    """

    spec: GrammarSpec
    start: int

    def __post_init__(self) -> None:
        if self.start < 0:
            raise ValueError("a grammar starts at a non-negative position")


@dataclass(frozen=True, slots=True)
class OutputConstraint:
    """A choice's output constraint: it starts at the first output token or, when the output
    begins inside reasoning, at the token after the end that closes it."""

    spec: GrammarSpec

    def start(self, prompt_len: int, answer_offset: int | None) -> int | None:
        """Where the grammar starts, given where the answer begins within the output (None:
        not yet, the reasoning is still open)."""
        return None if answer_offset is None else prompt_len + answer_offset

    def lane(self, prompt_len: int, answer_offset: int | None) -> GrammarLane | None:
        """The lane part, once the grammar has started; until then the lane is free text."""
        start = self.start(prompt_len, answer_offset)
        return None if start is None else GrammarLane(self.spec, start)
