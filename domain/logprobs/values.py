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


@dataclass(frozen=True, slots=True, init=False)
class PositionLogprobs:
    """One emitted position: the chosen token and the alternatives in reported order.

    The alternatives are kept as two parallel tuples, their IDs and their values, read from a
    frame in one call (`unpack_position_bytes`); `alternatives` builds their `TokenLogprob`s
    on demand.
    """

    chosen: TokenLogprob
    alternative_ids: tuple[int, ...]
    alternative_logprobs: tuple[float, ...]

    def __init__(self, chosen: TokenLogprob, alternatives: Sequence[TokenLogprob] = ()) -> None:
        object.__setattr__(self, "chosen", chosen)
        object.__setattr__(self, "alternative_ids", tuple(a.token_id for a in alternatives))
        object.__setattr__(self, "alternative_logprobs", tuple(a.logprob for a in alternatives))

    @classmethod
    def of_columns(
        cls, chosen: TokenLogprob, ids: tuple[int, ...], logprobs: tuple[float, ...]
    ) -> PositionLogprobs:
        """From the alternatives' IDs and values as two tuples of one length."""
        if len(ids) != len(logprobs):
            raise ValueError(f"{len(ids)} alternative IDs but {len(logprobs)} values")
        position: PositionLogprobs = object.__new__(cls)
        # Through the slots' own descriptors, as `quick_init` sets them: one is built per
        # emitted position, twice (the engine's read, then the API process's decode).
        _SET_CHOSEN(position, chosen)
        _SET_IDS(position, ids)
        _SET_LOGPROBS(position, logprobs)
        return position

    @property
    def alternatives(self) -> tuple[TokenLogprob, ...]:
        return tuple(map(TokenLogprob, self.alternative_ids, self.alternative_logprobs))


_SET_CHOSEN = vars(PositionLogprobs)["chosen"].__set__
_SET_IDS = vars(PositionLogprobs)["alternative_ids"].__set__
_SET_LOGPROBS = vars(PositionLogprobs)["alternative_logprobs"].__set__


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
def _position_layout(pairs: int) -> struct.Struct:
    """A position's first 1 + `pairs` (int32 ID, FP32 value) pairs, little-endian."""
    return struct.Struct("<" + "if" * (1 + pairs))


def unpack_position_bytes(buffer: bytes | memoryview, offset: int, pairs: int) -> PositionLogprobs:
    """One position from its int32 words in raw little-endian bytes, from byte `offset`: the
    chosen pair and up to `pairs` alternatives, stopping at the first -1 ID, in one unpack call;
    values are widened from FP32 exactly as `bits_to_float` widens them."""
    words = _position_layout(pairs).unpack_from(buffer, offset)
    # Sliced from the unpacked words directly: a copy of the pairs first cost a tenth of the
    # engine's time a K=20 step (bench/host.py profile).
    ids, values = words[2::2], words[3::2]
    if NO_TOKEN in ids:
        found = ids.index(NO_TOKEN)
        ids, values = ids[:found], values[:found]
    return PositionLogprobs.of_columns(TokenLogprob(words[0], words[1]), ids, values)


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
