"""What a span of a choice's text is, and the text scanning the parsers share."""

from __future__ import annotations

import enum


class Kind(enum.Enum):
    """What a span of the model's text is; only content spans give their tokens entries."""

    REASONING = enum.auto()
    CONTENT = enum.auto()
    TOOL = enum.auto()
    DELIMITER = enum.auto()
    STRIPPED = enum.auto()


def held_prefix(text: str, delimiter: str) -> int:
    """The length of the longest end of `text` that begins `delimiter` without completing it:
    the characters that must wait to see whether the delimiter follows."""
    for length in range(min(len(text), len(delimiter) - 1), 0, -1):
        if delimiter.startswith(text[-length:]):
            return length
    return 0


def leading_space(text: str) -> int:
    """The number of whitespace characters `text` starts with."""
    return len(text) - len(text.lstrip())
