"""What a core declares: named buffers and graphs, and the names core.proto defines for them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

DTYPES = frozenset({"int32", "int64", "float32", "bfloat16", "float16", "uint8", "bool"})
SCORED_PREFILL = "SCORED_PREFILL"
OPERATIONS = frozenset({"PREFILL", "DECODE", "MIXED", "VERIFY", SCORED_PREFILL})
# Graphs that commit generated tokens; in a logprob core each one binds the flag vector.
# A graph of any other operation that writes completion_logprobs must bind it too. A scored
# prefill may sample the final chunk's next token, so it is held to the same rule.
SAMPLING_OPERATIONS = frozenset({"DECODE", "MIXED", "VERIFY", SCORED_PREFILL})
VALUE_SOURCES = frozenset(
    {
        "INPUT_TOKENS",
        "POSITIONS",
        "BLOCK_TABLES",
        "SLOT_MAPPING",
        "SAMPLING_PARAMETERS",
        "LOGPROB_REQUESTED",
        "LOGPROB_TOKEN_IDS",
        "LOGPROB_TOKEN_ID_COUNTS",
        "PROMPT_TARGET_TOKEN",
    }
)


def describe_form(dtype: str, shape: Iterable[int | str]) -> str:
    """The `int32[2, 16, 8, 258]` spelling that validation messages use."""
    return f"{dtype}[{', '.join(str(extent) for extent in shape)}]"


@dataclass(frozen=True, slots=True)
class BufferDeclaration:
    """A named device buffer: element type (lower-case, e.g. "int32") and row-major shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("a buffer needs a non-empty name")
        if not isinstance(self.dtype, str):
            raise ValueError(f"buffer {self.name!r}: dtype must be a string")
        shape = tuple(self.shape)
        for extent in shape:
            if isinstance(extent, bool) or not isinstance(extent, int) or extent < 0:
                raise ValueError(f"buffer {self.name!r}: extents must be non-negative integers")
        object.__setattr__(self, "shape", shape)

    @property
    def form(self) -> str:
        return describe_form(self.dtype, self.shape)


@dataclass(frozen=True, slots=True)
class GraphDeclaration:
    """A graph: its operation name, (input name, value source name) bindings and output buffers."""

    name: str
    operation: str
    inputs: tuple[tuple[str, str], ...] = ()
    outputs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("a graph needs a non-empty name")
        inputs = tuple(tuple(binding) for binding in self.inputs)
        for binding in inputs:
            if len(binding) != 2 or not all(isinstance(part, str) for part in binding):
                raise ValueError(f"graph {self.name!r}: bindings are (input, source) strings")
        object.__setattr__(self, "inputs", inputs)
        object.__setattr__(self, "outputs", tuple(self.outputs))

    @property
    def samples(self) -> bool:
        return self.operation in SAMPLING_OPERATIONS
