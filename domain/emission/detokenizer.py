"""Incremental detokenization of generated token bytes into whole UTF-8 characters."""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence
from typing import Protocol


class TokenSpelling(Protocol):
    """What decoding needs of a tokenizer (the `ports.tokenizer.Tokenizer` has it all)."""

    def token_bytes(self, token_id: int) -> bytes: ...

    @property
    def special_token_ids(self) -> frozenset[int]: ...

    @property
    def strips_leading_space(self) -> bool: ...


def _continues(pending: bytes, byte: int) -> bool:
    """Whether ``byte`` can extend ``pending``, a valid but incomplete UTF-8 prefix."""
    if len(pending) == 1:
        # The second byte of a few lead bytes has a narrower range, which is what rules out
        # overlong forms, surrogates and code points above U+10FFFF.
        lead = pending[0]
        if lead == 0xE0:
            return 0xA0 <= byte <= 0xBF
        if lead == 0xED:
            return 0x80 <= byte <= 0x9F
        if lead == 0xF0:
            return 0x90 <= byte <= 0xBF
        if lead == 0xF4:
            return 0x80 <= byte <= 0x8F
    return 0x80 <= byte <= 0xBF


def _is_incomplete_character(data: bytes) -> bool:
    """Whether ``data`` is the start of a valid multi-byte character that lacks bytes."""
    lead = data[0]
    if lead < 0xC2 or lead > 0xF4:
        return False
    length = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
    if len(data) >= length:
        return False
    return all(_continues(data[:index], data[index]) for index in range(1, len(data)))


class IncrementalDetokenizer:
    """Turns token ids into text one token at a time, never splitting a character.

    The released text always equals what ``bytes.decode('utf-8', errors='replace')`` gives for
    the bytes seen so far, minus a trailing incomplete character that is held (at most three
    bytes) until it completes, is broken by a byte that cannot continue it, or ``flush`` ends
    the sequence. Skipped special tokens contribute no bytes, so a character split around one
    still joins up.
    """

    __slots__ = (
        "_token_bytes",
        "_special_token_ids",
        "_skip_special_tokens",
        "_strip_leading_space",
        "_pending",
        "_pieces",
        "_length",
        "_offsets",
        "_provisional",
        "_at_start",
        "_finished",
    )

    def __init__(
        self,
        token_bytes: Callable[[int], bytes],
        *,
        special_token_ids: frozenset[int] = frozenset(),
        skip_special_tokens: bool = True,
        strip_leading_space: bool = False,
    ) -> None:
        if not callable(token_bytes):
            raise TypeError("token_bytes must be callable")
        if not isinstance(special_token_ids, frozenset):
            raise TypeError("special_token_ids must be a frozenset of token ids")
        if not isinstance(skip_special_tokens, bool):
            raise TypeError("skip_special_tokens must be a bool")
        if not isinstance(strip_leading_space, bool):
            raise TypeError("strip_leading_space must be a bool")
        self._token_bytes = token_bytes
        self._special_token_ids = special_token_ids
        self._skip_special_tokens = skip_special_tokens
        self._strip_leading_space = strip_leading_space
        self._pending = b""
        self._pieces: list[str] = []
        self._length = 0
        self._offsets: list[int] = []
        # Index of the first token with no bytes pushed while a character is held: where it
        # lands depends on the next byte (in that character, or after its U+FFFD).
        self._provisional: int | None = None
        # True until the first character is released: only that one may be a stripped space.
        self._at_start = True
        self._finished = False

    def push(self, token_id: int) -> str:
        """Add one token and return the text it completes (possibly empty)."""
        if self._finished:
            raise RuntimeError("push after flush: the sequence has ended")
        if self._skip_special_tokens and token_id in self._special_token_ids:
            piece = b""
        else:
            piece = self._token_bytes(token_id)
        pending = self._pending
        if not piece:
            # A token with no bytes lands where the next byte does; while a character is held
            # that is not known yet, so it points at the held character until it is.
            if pending and self._provisional is None:
                self._provisional = len(self._offsets)
            self._offsets.append(self._length)
            return ""
        if pending and not _continues(pending, piece[0]):
            # The held prefix is a maximal invalid subpart now, rendered as exactly one U+FFFD
            # ahead of this token's first character, and so ahead of every token waiting on it.
            self._settle(self._length + 1)
            self._offsets.append(self._length + 1)
        else:
            self._settle(self._length)
            self._offsets.append(self._length)
        data = pending + piece if pending else piece
        text, consumed = codecs.utf_8_decode(data, "replace", False)
        rest = data[consumed:]
        if rest and not _is_incomplete_character(rest):
            # CPython holds ED A0..BF (a surrogate, kept for the surrogatepass handler) though
            # no byte can make it valid; render it now so held bytes always form one character.
            text += codecs.utf_8_decode(rest, "replace", True)[0]
            rest = b""
        self._pending = rest
        return self._release(text)

    def flush(self) -> str:
        """End the sequence, releasing a held incomplete character as U+FFFD."""
        self._finished = True
        if not self._pending:
            return ""
        # The held character becomes one U+FFFD; tokens waiting on it land after it.
        self._settle(self._length + 1)
        text, _ = codecs.utf_8_decode(self._pending, "replace", True)
        self._pending = b""
        return self._release(text)

    def _settle(self, offset: int) -> None:
        """Gives the tokens with no bytes that wait on the next byte the offset it lands at."""
        if self._provisional is None:
            return
        for index in range(self._provisional, len(self._offsets)):
            self._offsets[index] = offset
        self._provisional = None

    def _release(self, text: str) -> str:
        if not text:
            return ""
        if self._at_start:
            self._at_start = False
            if self._strip_leading_space and text[0] == " ":
                text = text[1:]
                if not text:
                    return ""
        self._pieces.append(text)
        self._length += len(text)
        return text

    @property
    def text(self) -> str:
        """All text released so far."""
        if len(self._pieces) > 1:
            # Collapse once so repeated reads stay cheap.
            self._pieces = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    @property
    def num_tokens(self) -> int:
        """Number of tokens pushed, skipped special tokens included."""
        return len(self._offsets)

    def offset(self, index: int) -> int:
        """Character index in ``text`` where token ``index``'s first byte lands.

        A token that continues a character begun earlier points at that character; a token
        that adds no bytes lands where the next byte does (the end of the text if none comes).
        Tokens from ``settled`` on have provisional offsets: each points at the held character
        and moves one past it if that character ends up a U+FFFD without them.
        """
        return self._offsets[index]

    @property
    def offsets(self) -> tuple[int, ...]:
        """``offset(i)`` for every token pushed so far (a copy)."""
        return tuple(self._offsets)

    @property
    def settled(self) -> int:
        """The number of leading tokens whose offsets are final."""
        return len(self._offsets) if self._provisional is None else self._provisional


def decode_whole(
    tokenizer: TokenSpelling, token_ids: Sequence[int], *, skip_special_tokens: bool
) -> IncrementalDetokenizer:
    """A flushed decoder over `token_ids`: text shown for whole token sequences (an echoed
    token-ID prompt) comes from here, so its `text` and `offsets` agree by construction."""
    decoder = IncrementalDetokenizer(
        tokenizer.token_bytes,
        special_token_ids=tokenizer.special_token_ids,
        skip_special_tokens=skip_special_tokens,
        strip_leading_space=tokenizer.strips_leading_space,
    )
    for token_id in token_ids:
        decoder.push(token_id)
    decoder.flush()
    return decoder
