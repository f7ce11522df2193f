"""Logprob values, limits and the packed int32 position layout shared by device and host."""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from domain.common.frozen import quick_init
from domain.common.ranges import TOKEN_ID, check_logprob_count
from domain.common.wire import REPR_FIXED_FROM, wire_float

NATURAL_TOP_K = 20
MAX_SELECTED_IDS = 128
FULL_POSITION_WORDS = 2 + 2 * MAX_SELECTED_IDS
LOGPROB_FLOOR = -9999.0
NO_TOKEN = -1


def float_to_bits(value: float) -> int:
    """FP32 bits of `value` as a signed int32, the way the packed layout stores them."""
    bits: int = struct.unpack("<i", struct.pack("<f", value))[0]
    return bits


def bits_to_float(bits: int) -> float:
    value: float = struct.unpack("<f", struct.pack("<i", bits))[0]
    return value


def sort_key(logprob: float, token_id: int) -> int:
    """The integer that ranks alternatives: larger FP32 value first, then smaller token ID.

    The FP32 bits map order-preservingly onto int32 (negative values flip their magnitude bits),
    with -0.0 normalized to +0.0 first; the low 32 bits hold the inverted token ID.
    """
    bits = float_to_bits(logprob + 0.0)
    ordered = bits if bits >= 0 else bits ^ 0x7FFFFFFF
    return (ordered << 32) | (0xFFFFFFFF - token_id)


@quick_init
@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One token and its logprob, the FP32 value the device wrote, widened to a float."""

    token_id: int
    logprob: float


@dataclass(frozen=True, slots=True, init=False, eq=False)
class PositionLogprobs:
    """One emitted position: the chosen token and the alternatives in reported order.

    The alternatives are two parallel tuples, their IDs and their values; `alternatives` builds
    their `TokenLogprob`s on demand. A position read from a frame keeps them as the frame's
    bytes instead (`packed`: little-endian int32 ID and FP32 bits a pair) and unpacks the tuples
    on first use: a K=20 position then crosses the engine socket and reaches the chat JSON
    writer, which reads the bytes (`adapters/http/logprob_json`), without 40 Python numbers
    made, pickled, loaded and freed on the way. Equal positions compare equal in either form.
    """

    chosen: TokenLogprob
    packed: bytes | None
    _ids: tuple[int, ...] | None
    _logprobs: tuple[float, ...] | None

    def __init__(self, chosen: TokenLogprob, alternatives: Sequence[TokenLogprob] = ()) -> None:
        ids = tuple(a.token_id for a in alternatives)
        _fill(self, chosen, None, ids, tuple(a.logprob for a in alternatives))

    @classmethod
    def of_columns(
        cls, chosen: TokenLogprob, ids: tuple[int, ...], logprobs: tuple[float, ...]
    ) -> PositionLogprobs:
        """From the alternatives' IDs and values as two tuples of one length."""
        if len(ids) != len(logprobs):
            raise ValueError(f"{len(ids)} alternative IDs but {len(logprobs)} values")
        return _fill(object.__new__(cls), chosen, None, ids, logprobs)

    @classmethod
    def of_packed(cls, chosen: TokenLogprob, packed: bytes) -> PositionLogprobs:
        """From the alternatives' (int32 ID, FP32 bits) pairs, little-endian, none of them
        `NO_TOKEN`."""
        if len(packed) % 8:
            raise ValueError(f"{len(packed)} bytes are not whole (ID, value) pairs")
        return _fill(object.__new__(cls), chosen, packed, None, None)

    @property
    def alternative_ids(self) -> tuple[int, ...]:
        ids = self._ids
        return ids if ids is not None else self._unpacked()[0]

    @property
    def alternative_logprobs(self) -> tuple[float, ...]:
        logprobs = self._logprobs
        return logprobs if logprobs is not None else self._unpacked()[1]

    def _unpacked(self) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """The packed pairs as the two tuples, kept (values widened as `bits_to_float` does);
        two threads that unpack at once store equal tuples."""
        packed = self.packed or b""
        words = _pairs_layout(len(packed) // 8).unpack(packed)
        ids, logprobs = words[0::2], words[1::2]
        _SET_IDS(self, ids)
        _SET_LOGPROBS(self, logprobs)
        return ids, logprobs

    @property
    def alternatives(self) -> tuple[TokenLogprob, ...]:
        return tuple(map(TokenLogprob, self.alternative_ids, self.alternative_logprobs))

    def _key(self) -> tuple[TokenLogprob, tuple[int, ...], tuple[float, ...]]:
        return self.chosen, self.alternative_ids, self.alternative_logprobs

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PositionLogprobs):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (
            f"PositionLogprobs(chosen={self.chosen!r}, alternative_ids={self.alternative_ids!r}, "
            f"alternative_logprobs={self.alternative_logprobs!r})"
        )


_SET_CHOSEN = vars(PositionLogprobs)["chosen"].__set__
_SET_PACKED = vars(PositionLogprobs)["packed"].__set__
_SET_IDS = vars(PositionLogprobs)["_ids"].__set__
_SET_LOGPROBS = vars(PositionLogprobs)["_logprobs"].__set__


def _fill(
    position: PositionLogprobs,
    chosen: TokenLogprob,
    packed: bytes | None,
    ids: tuple[int, ...] | None,
    logprobs: tuple[float, ...] | None,
) -> PositionLogprobs:
    """Sets a new position's fields through the slots' own descriptors, as `quick_init` does:
    one is built per emitted position, twice (the engine's read, the API process's decode)."""
    _SET_CHOSEN(position, chosen)
    _SET_PACKED(position, packed)
    _SET_IDS(position, ids)
    _SET_LOGPROBS(position, logprobs)
    return position


def unpack_pairs(words: Sequence[int], first: int, pairs: int) -> tuple[TokenLogprob, ...]:
    """Up to `pairs` (ID, FP32 bits) pairs from word `first` on, stopping at the first -1 ID."""
    found = []
    for word in range(first, first + 2 * pairs, 2):
        token_id = words[word]
        if token_id == NO_TOKEN:
            break
        found.append(TokenLogprob(token_id, bits_to_float(words[word + 1])))
    return tuple(found)


@functools.cache
def _pairs_layout(pairs: int) -> struct.Struct:
    """`pairs` (int32 ID, FP32 value) pairs, little-endian."""
    return struct.Struct("<" + "if" * pairs)


_CHOSEN_PAIR = struct.Struct("<if")
_NO_TOKEN_WORD = struct.pack("<i", NO_TOKEN)


def unpack_position_bytes(buffer: bytes | memoryview, offset: int, pairs: int) -> PositionLogprobs:
    """One position from its int32 words in raw little-endian bytes, from byte `offset`: the
    chosen pair and up to `pairs` alternatives, stopping at the first -1 ID; the alternatives
    stay packed (`PositionLogprobs.of_packed`), values widened from FP32 when unpacked exactly
    as `bits_to_float` widens them."""
    token_id, value = _CHOSEN_PAIR.unpack_from(buffer, offset)
    if not pairs:
        return PositionLogprobs.of_packed(TokenLogprob(token_id, value), b"")
    first = offset + 8
    packed = bytes(buffer[first : first + 8 * pairs])
    # The first -1 ID: the bytes of -1 found at a pair's start (a NaN's bits can hold them too).
    end = packed.find(_NO_TOKEN_WORD)
    while end >= 0 and end % 8:
        end = packed.find(_NO_TOKEN_WORD, end + 1)
    if end >= 0:
        packed = packed[:end]
    return PositionLogprobs.of_packed(TokenLogprob(token_id, value), packed)


def wire_logprob(value: float) -> float:
    """JSON has no -inf: it is rendered as -9999.0, as vLLM does; the value's text is the one
    `json.dumps` writes, whichever encoder writes it (`wire_float`)."""
    return LOGPROB_FLOOR if value == -math.inf or value < LOGPROB_FLOOR else wire_float(value)


def wire_logprobs(values: Sequence[float]) -> list[float]:
    """`wire_logprob` of each value, in one pass: most values (from the floor up to -1e-4)
    are already what the wire shows."""
    floor, top = LOGPROB_FLOOR, -REPR_FIXED_FROM
    return [value if floor <= value <= top else wire_logprob(value) for value in values]


@dataclass(frozen=True, slots=True)
class LogprobOptions:
    """What a request asks for at each generated position.

    `top_k` natural alternatives (0 means the chosen token only), or, when `token_ids` is set,
    those IDs in caller order instead of natural alternatives.
    """

    top_k: int = 0
    token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        # The most any core serves; the served core and `--max-logprobs` may allow fewer.
        check_logprob_count("sample", self.top_k, NATURAL_TOP_K, "logprobs")
        TOKEN_ID.check_each(self.token_ids, "logprob_token_ids")

    @property
    def selects(self) -> bool:
        return bool(self.token_ids)

    @property
    def pairs(self) -> int:
        """Alternative pairs the position carries."""
        return len(self.token_ids) if self.token_ids else self.top_k
