"""The parsing choice parser: reasoning and tool-call spans, and content entry attribution."""

from __future__ import annotations

from domain.outputs import ChoiceDelta
from domain.parsers.parsed import ParsedDelta, ParserConfig


class SegmentingParser:
    """Interim: the real parser replaces this in the next commit of the `parsers` branch."""

    def __init__(self, index: int, config: ParserConfig) -> None:
        self._index = index
        self._config = config

    def feed(self, delta: ChoiceDelta) -> ParsedDelta:
        raise NotImplementedError("reasoning and tool-call parsing are not implemented yet")
