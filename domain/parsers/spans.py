"""The text scanning the parsers share: delimiters that may still be forming, whitespace."""

from __future__ import annotations


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
