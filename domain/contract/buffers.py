"""The contract's named buffers: one table of name, dtype, shape, group and input source."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from domain.contract.records import HEADER_WORDS
from domain.logprobs.prompt_scores import PROMPT_ROW_WORDS
from domain.logprobs.values import FULL_POSITION_WORDS, MAX_SELECTED_IDS

COMPLETION_RECORDS = "completion_records"
COMPLETION_LOGPROBS = "completion_logprobs"
LOGPROB_REQUESTED = "logprob_requested"
LOGPROB_TOKEN_IDS = "logprob_token_ids"
LOGPROB_TOKEN_ID_COUNTS = "logprob_token_id_counts"
PROMPT_LOGPROBS = "prompt_logprobs"
PROMPT_TARGET_TOKENS = "prompt_target_tokens"
# Submissions alternate between two frames, so a reader holds one while the next writes the other.
COMPLETION_FRAMES = 2

# An extent is a number, or a size's name ("C") where a message describes a family of forms.
Extent = int | str
# (capacity, T, C) -> extents: the padded slot capacity, the resolved completion token
# capacity and the prefill chunk limit (the largest scored capacity).
Shape = Callable[[int, int, Extent], tuple[Extent, ...]]


class BufferGroup(enum.Enum):
    """Buffers a core declares together: any member of a group requires the whole group.

    Natural logprobs also require the records, and selected-ID inputs require both groups
    before them (the five buffers of the full bundle). Prompt scoring requires K=20 generation
    logprobs, a rule of the capability rather than of the table.
    """

    RECORDS = "records"
    NATURAL = "natural logprobs"
    SELECTED_IDS = "selected-ID inputs"
    PROMPT_SCORING = "prompt scoring"


# Short names for the table below.
_RECORDS, _NATURAL = BufferGroup.RECORDS, BufferGroup.NATURAL
_SELECTED, _SCORING = BufferGroup.SELECTED_IDS, BufferGroup.PROMPT_SCORING


@dataclass(frozen=True, slots=True)
class ContractBuffer:
    """One row of the table. `source` feeds an input of the same name; outputs have none."""

    name: str
    dtype: str
    shape: Shape
    group: BufferGroup
    source: str | None = None

    def form(
        self, capacity: int, token_capacity: int, rows: Extent = 0
    ) -> tuple[str, tuple[Extent, ...]]:
        """(dtype, shape) for `capacity` slots, T = `token_capacity` and C = `rows`."""
        return self.dtype, self.shape(capacity, token_capacity, rows)


# One row per buffer: name, dtype, shape (capacity, T, C), group, and the value source of an
# input (outputs have none).
# fmt: off
CONTRACT_BUFFERS = (
    ContractBuffer(COMPLETION_RECORDS, "int64",
                   lambda n, t, c: (COMPLETION_FRAMES, n, HEADER_WORDS + t), _RECORDS),
    ContractBuffer(COMPLETION_LOGPROBS, "int32",
                   lambda n, t, c: (COMPLETION_FRAMES, n, t, FULL_POSITION_WORDS), _NATURAL),
    ContractBuffer(LOGPROB_REQUESTED, "int32", lambda n, t, c: (n,), _NATURAL,
                   source="LOGPROB_REQUESTED"),
    ContractBuffer(LOGPROB_TOKEN_IDS, "int32", lambda n, t, c: (n, MAX_SELECTED_IDS), _SELECTED,
                   source="LOGPROB_TOKEN_IDS"),
    ContractBuffer(LOGPROB_TOKEN_ID_COUNTS, "int32", lambda n, t, c: (n,), _SELECTED,
                   source="LOGPROB_TOKEN_ID_COUNTS"),
    ContractBuffer(PROMPT_LOGPROBS, "int32",
                   lambda n, t, c: (COMPLETION_FRAMES, c, PROMPT_ROW_WORDS), _SCORING),
    ContractBuffer(PROMPT_TARGET_TOKENS, "int32", lambda n, t, c: (c,), _SCORING,
                   source="PROMPT_TARGET_TOKEN"),
)
# fmt: on
GENERATION_GROUPS = (BufferGroup.RECORDS, BufferGroup.NATURAL, BufferGroup.SELECTED_IDS)
_BY_NAME = {buffer.name: buffer for buffer in CONTRACT_BUFFERS}


def buffers_in(*groups: BufferGroup) -> tuple[ContractBuffer, ...]:
    """The table's rows of `groups`, in table order."""
    return tuple(buffer for buffer in CONTRACT_BUFFERS if buffer.group in groups)


def contract_buffer(name: str) -> ContractBuffer:
    """The table's row for the buffer called `name`."""
    return _BY_NAME[name]


def input_sources(*groups: BufferGroup) -> dict[str, str]:
    """Input buffer name -> the value source feeding it, for the inputs of `groups`."""
    return {buffer.name: buffer.source for buffer in buffers_in(*groups) if buffer.source}
