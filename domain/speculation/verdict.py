"""The speculative verdict: which of a lane's drafts stand, then the correction or the bonus."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Verdict:
    """A verified round of one lane: the drafts that stood, then the target's own token.

    `accepted` is how many leading `tokens` are drafts; the last token is the target's (the
    correction after a rejection, or the bonus after a fully kept run).
    """

    tokens: tuple[int, ...]
    accepted: int

    def __post_init__(self) -> None:
        if not 0 <= self.accepted < len(self.tokens):
            raise ValueError(f"{self.accepted} accepted drafts in a round of {self.tokens}")


def speculative_verdict(drafts: Sequence[int], rows: Iterable[tuple[bool, int]]) -> Verdict:
    """Drafts stand while their rows keep them; the first row that does not emits its own token
    (the correction), and a fully kept run emits the row after the last draft's (the bonus).

    `rows` gives each target row's (keeps its draft, own token), row j verifying draft j and
    row len(drafts) having no draft (its keep is never read). It is consumed lazily, up to the
    first row that rejects, so a caller may compute a row only once the drafts before it stood.
    """
    tokens: list[int] = []
    taken = iter(rows)
    for draft in drafts:
        keeps, own = _next_row(taken, len(tokens))
        if not keeps:
            return Verdict((*tokens, own), len(tokens))
        tokens.append(draft)
    _, bonus = _next_row(taken, len(tokens))
    return Verdict((*tokens, bonus), len(tokens))


def _next_row(rows: Iterator[tuple[bool, int]], index: int) -> tuple[bool, int]:
    row = next(rows, None)
    if row is None:
        raise ValueError(f"the round has no target row {index}")
    return row
