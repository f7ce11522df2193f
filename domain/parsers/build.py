"""Builds a choice's output parser from its `ParserConfig`: the one door to the parsers."""

from __future__ import annotations

from domain.parsers.choice import SegmentingParser
from domain.parsers.forced import ForcedCallParser
from domain.parsers.parsed import ChoiceParser, ParserConfig, PassThrough


def choice_parser(index: int, config: ParserConfig) -> ChoiceParser:
    """The parser of choice `index` under `config`."""
    parser: ChoiceParser = PassThrough()
    if config.segments:
        parser = SegmentingParser(index, config)
    if config.forced is not None:
        parser = ForcedCallParser(parser, config.forced)
    return parser
