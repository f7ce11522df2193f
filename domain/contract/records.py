"""ABI6 completion records: the only way a step's outcome reaches the host."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

HEADER_WORDS = 16
DEFAULT_TOKEN_CAPACITY = 8


class Role(enum.IntEnum):
    """What the lane did in the step; only SAMPLE and SPECULATIVE can emit tokens."""

    EMPTY = 0
    SAMPLE = 1
    SPECULATIVE = 2
    PROMPT = 3
    SCORED = 4
    ADMISSION = 5
    MAINTENANCE = 6
    VISION = 7
    INVALID = 8


class Finish(enum.IntEnum):
    """Why the commit ended the lane's request in this step, if it did."""

    NONE = 0
    STOP_TOKEN = 1
    LENGTH = 2
    ERROR = 3


class RecordWord(enum.IntEnum):
    """Word index of each header field in a record."""

    SLOT = 0
    EPOCH = 1
    ROLE = 2
    EMITTED = 3
    FIRST_POSITION = 4
    FORCED_MASK = 5
    FINISH = 6
    DRAFTS_OFFERED = 7
    DRAFTS_ACCEPTED = 8
    GENERATED_TOTAL = 9


def resolve_token_capacity(declared: int | None) -> int:
    """T from a core: zero or omission means eight; positive values are literal."""
    if declared is None or declared == 0:
        return DEFAULT_TOKEN_CAPACITY
    if declared < 0:
        raise ValueError(f"completion_token_capacity must be non-negative, got {declared}")
    return declared


@dataclass(frozen=True, slots=True)
class CompletionRecord:
    """One lane of a completion frame: who it belongs to and which tokens it emitted."""

    slot: int
    epoch: int
    role: Role
    tokens: tuple[int, ...] = ()
    first_position: int = 0
    forced_mask: int = 0
    finish: Finish = Finish.NONE
    drafts_offered: int = 0
    drafts_accepted: int = 0
    generated_total: int = 0

    def __post_init__(self) -> None:
        if self.slot < 0 or self.epoch < 0:
            raise ValueError("slot and epoch must be non-negative")
        if self.tokens and self.role not in (Role.SAMPLE, Role.SPECULATIVE):
            raise ValueError(f"role {self.role.name} cannot emit tokens")

    @property
    def emits(self) -> bool:
        return bool(self.tokens)

    def is_forced(self, index: int) -> bool:
        return bool(self.forced_mask >> index & 1)

    def encode(self, token_capacity: int) -> list[int]:
        """The record as 16 + T int64 words."""
        if len(self.tokens) > token_capacity:
            raise ValueError(
                f"{len(self.tokens)} tokens exceed the record capacity {token_capacity}"
            )
        words = [0] * (HEADER_WORDS + token_capacity)
        words[RecordWord.SLOT] = self.slot
        words[RecordWord.EPOCH] = self.epoch
        words[RecordWord.ROLE] = self.role
        words[RecordWord.EMITTED] = len(self.tokens)
        words[RecordWord.FIRST_POSITION] = self.first_position
        words[RecordWord.FORCED_MASK] = self.forced_mask
        words[RecordWord.FINISH] = self.finish
        words[RecordWord.DRAFTS_OFFERED] = self.drafts_offered
        words[RecordWord.DRAFTS_ACCEPTED] = self.drafts_accepted
        words[RecordWord.GENERATED_TOTAL] = self.generated_total
        words[HEADER_WORDS : HEADER_WORDS + len(self.tokens)] = self.tokens
        return words

    @classmethod
    def decode(cls, words: Sequence[int]) -> CompletionRecord:
        """Reads a record; only the emitted prefix of the token words is meaningful."""
        emitted = words[RecordWord.EMITTED]
        if emitted < 0 or HEADER_WORDS + emitted > len(words):
            raise ValueError(f"record claims {emitted} emitted tokens")
        return cls(
            slot=words[RecordWord.SLOT],
            epoch=words[RecordWord.EPOCH],
            role=Role(words[RecordWord.ROLE]),
            tokens=tuple(words[HEADER_WORDS : HEADER_WORDS + emitted]),
            first_position=words[RecordWord.FIRST_POSITION],
            forced_mask=words[RecordWord.FORCED_MASK],
            finish=Finish(words[RecordWord.FINISH]),
            drafts_offered=words[RecordWord.DRAFTS_OFFERED],
            drafts_accepted=words[RecordWord.DRAFTS_ACCEPTED],
            generated_total=words[RecordWord.GENERATED_TOTAL],
        )
