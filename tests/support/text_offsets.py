"""The text-offset rule computed from token bytes alone (contracts/api.md, "Text offsets").

The reference never runs the server's decoder: a byte position's character is found by cutting
the whole byte string there, since a cut at a character boundary decodes into two halves whose
lengths add up to the whole, and a cut inside one renders it as extra replacements.
"""

from __future__ import annotations

from collections.abc import Sequence


def decoded(data: bytes) -> str:
    """The final text of `data`: UTF-8 with each maximal invalid subpart one U+FFFD."""
    return data.decode("utf-8", errors="replace")


def char_index(data: bytes, position: int) -> int:
    """Index, in `decoded(data)`, of the character holding byte `position` (the text's length
    at the end)."""
    before = len(decoded(data[:position]))
    return before if _boundary(data, position) else before - 1


def _boundary(data: bytes, position: int) -> bool:
    return len(decoded(data[:position])) + len(decoded(data[position:])) == len(decoded(data))


def offsets_by_rule(pieces: Sequence[bytes]) -> list[int]:
    """Each piece's offset: the character holding its first byte; a piece with no bytes (a
    skipped special token) lands where the next byte does, or at the end."""
    data = b"".join(pieces)
    offsets, position = [], 0
    for piece in pieces:
        offsets.append(char_index(data, position))
        position += len(piece)
    return offsets


def character_starts(data: bytes) -> list[int]:
    """The byte where each character of `decoded(data)` starts, then the length."""
    return [p for p in range(len(data) + 1) if _boundary(data, p)]


def slices_match_bytes(pieces: Sequence[bytes], offsets: Sequence[int]) -> bool:
    """Whether slicing the text at consecutive offsets gives each piece the characters whose
    first byte lies from its own first byte's character up to the next piece's."""
    data = b"".join(pieces)
    text, starts = decoded(data), character_starts(data)
    bounds = [*offsets, len(text)]
    return all(
        text[start:end] == decoded(data[starts[start] : starts[end]])
        for start, end in zip(bounds, bounds[1:], strict=False)
    )
