"""Which emitted tokens get logprob entries, and in which part of the output: the one home.

An emitted token's entry passes two gates, both decided here. Emission (`ChoiceEmission`)
asks `emission_keeps` with what the token is (`Emitted`): a forced token never has an entry; a
terminating stop token (EOS or a `stop_token_ids` entry) and a token at or after a stop
string's start have one only under `echo`, where arrays are indexed by position; every other
token has one, an EOS under `ignore_eos` included. An output parser then gives each token the
`Part` that holds its first character (`PartMap.part_at`), and `part_keeps` says which part's
tokens keep their entries: content only. Reasoning, tool-call data (a forced call's JSON too),
delimiters and stripped whitespace have none; reasoning tokens are counted instead.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Sequence

from domain.common.errors import LogprobDataError
from domain.contract.records import CompletionRecord
from domain.logprobs.values import PositionLogprobs


class Emitted(enum.Enum):
    """What an emitted token is to its choice, as far as its entry goes."""

    ORDINARY = enum.auto()  # an EOS under `ignore_eos` is one
    FORCED = enum.auto()  # the record's forced mask: the engine chose it, not the model
    STOP = enum.auto()  # the terminating stop token (EOS or a `stop_token_ids` entry)
    PAST_STOP = enum.auto()  # its first character is at or after a stop string's start


class Part(enum.Enum):
    """What a span of a choice's text is; a token belongs to the part of its first character."""

    REASONING = enum.auto()
    CONTENT = enum.auto()
    TOOL = enum.auto()
    DELIMITER = enum.auto()
    STRIPPED = enum.auto()


def emission_keeps(token: Emitted, *, echo: bool) -> bool:
    """Whether a `token` keeps its entry in the choice's (unparsed) entries."""
    if token is Emitted.FORCED:
        return False
    return token is Emitted.ORDINARY or echo


def part_keeps(part: Part | None) -> bool:
    """Whether a token whose first character lies in `part` keeps its entry once parsed; None
    is a token in no part (its text was dropped)."""
    return part is Part.CONTENT


def record_entries(
    record: CompletionRecord, payload: Sequence[PositionLogprobs], *, echo: bool
) -> tuple[PositionLogprobs | None, ...]:
    """One entry per emitted token of `record`, None where the rule drops it; the payload must
    agree: a requesting lane carries exactly one decoded position per emitted token, each
    naming the emitted token as its chosen ID (`LogprobDataError` otherwise)."""
    if len(payload) != len(record.tokens):
        raise LogprobDataError(
            f"slot {record.slot}: {len(payload)} logprob positions for "
            f"{len(record.tokens)} emitted tokens"
        )
    if not record.forced_mask:
        # No token is forced, so every one keeps its entry (`emission_keeps`), echo or not.
        for token_id, position in zip(record.tokens, payload, strict=True):
            if position.chosen.token_id != token_id:
                raise _misnamed(record, position, token_id)
        return tuple(payload)
    entries: list[PositionLogprobs | None] = []
    for index, (token_id, position) in enumerate(zip(record.tokens, payload, strict=True)):
        token = Emitted.FORCED if record.is_forced(index) else Emitted.ORDINARY
        if not emission_keeps(token, echo=echo):
            entries.append(None)
            continue
        if position.chosen.token_id != token_id:
            raise _misnamed(record, position, token_id)
        entries.append(position)
    return tuple(entries)


def _misnamed(
    record: CompletionRecord, position: PositionLogprobs, token_id: int
) -> LogprobDataError:
    return LogprobDataError(
        f"slot {record.slot}: logprob payload names token {position.chosen.token_id} "
        f"where the record emitted {token_id}"
    )


class PartMap:
    """The parts of a choice's text as a parser classifies it, for tokens still to attribute.

    Spans arrive in text order (`add`); `part_at` names the part holding a raw text offset
    and `content_offset` moves an offset in content into the concatenated content. Tokens are
    attributed in order, so spans every remaining token starts after are dropped (`forget`).
    """

    def __init__(self) -> None:
        # (raw start, raw end, part, content start), adjacent spans of one part merged.
        self._spans: deque[tuple[int, int, Part, int]] = deque()
        self.end = 0  # raw length classified so far
        self.content_length = 0
        self.last: Part | None = None  # the part of the last classified character

    def add(self, length: int, part: Part) -> None:
        """The next `length` characters of the text are `part`."""
        if length == 0:
            return
        start, content_start = self.end, self.content_length
        if self._spans and self._spans[-1][2] is part:
            start, _, _, content_start = self._spans.pop()
        self.end += length
        self._spans.append((start, self.end, part, content_start))
        if part is Part.CONTENT:
            self.content_length += length
        self.last = part

    def part_at(self, offset: int, *, tail: Part | None) -> Part | None:
        """The part of the character at raw `offset`; a token past the classified text (one
        with no text of its own at the end) is in `tail`, the part still open."""
        if offset >= self.end:
            return tail
        for start, end, part, _ in self._spans:
            if start <= offset < end:
                return part
        return None

    def content_offset(self, offset: int) -> int:
        """Where the content character at raw `offset` (or the end of the text) lands in the
        concatenated content."""
        for start, end, part, content_start in self._spans:
            if part is Part.CONTENT and start <= offset < end:
                return content_start + offset - start
        return self.content_length

    def forget(self, horizon: int) -> None:
        """Drops the spans that end at or before `horizon`, where every later token starts."""
        while self._spans and self._spans[0][1] <= horizon:
            self._spans.popleft()
