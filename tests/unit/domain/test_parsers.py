"""Output parsers: reasoning, hermes tool calls, and which tokens' entries content keeps."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.contract.records import CompletionRecord, Finish, Role
from domain.emission.choice import ChoiceEmission
from domain.emission.entries import Part
from domain.emission.outputs import ChoiceDelta, LogprobEntry
from domain.logprobs.values import PositionLogprobs, TokenLogprob
from domain.parsers.build import choice_parser
from domain.parsers.forced import whole_forced_answer
from domain.parsers.parsed import ParsedDelta, ParserConfig
from domain.requests.sampling import SamplingParams
from domain.structured.tool_calls import ToolCallMode

DEEPSEEK = ParserConfig(reasoning_parser="deepseek_r1")
QWEN = ParserConfig(reasoning_parser="qwen3")
HERMES = ParserConfig(tool_call_parser="hermes", tools=True)
BOTH = ParserConfig(reasoning_parser="deepseek_r1", tool_call_parser="hermes", tools=True)


class PieceTokenizer:
    """Token t is `pieces[t]`; pieces may split characters anywhere. No specials, no EOS."""

    eos_token_ids: frozenset[int] = frozenset()
    special_token_ids: frozenset[int] = frozenset()
    strips_leading_space = False

    def __init__(self, pieces: Sequence[bytes]) -> None:
        self._pieces = pieces

    def token_bytes(self, token_id: int) -> bytes:
        return self._pieces[token_id]


def position(token_id: int) -> PositionLogprobs:
    return PositionLogprobs(TokenLogprob(token_id, -0.25 - token_id))


@dataclass
class Outcome:
    raw: list[ChoiceDelta]
    parsed: list[ParsedDelta]

    @property
    def reasoning(self) -> str:
        return "".join(p.reasoning for p in self.parsed)

    @property
    def content(self) -> str:
        return "".join(p.content for p in self.parsed)

    @property
    def entries(self) -> list[LogprobEntry]:
        return [e for p in self.parsed for e in p.content_logprobs]

    @property
    def entry_ids(self) -> list[int]:
        return [e.position.chosen.token_id for e in self.entries]

    def calls(self) -> list[tuple[str, str]]:
        calls: dict[int, list[str]] = {}
        for delta in (d for p in self.parsed for d in p.tool_calls):
            if delta.id is not None:
                assert delta.index == len(calls) and delta.name is not None
                calls[delta.index] = [delta.name, ""]
            calls[delta.index][1] += delta.arguments
        return [(name, arguments) for name, arguments in calls.values()]


def run(
    pieces: Sequence[bytes], config: ParserConfig, groups: Sequence[int] | None = None
) -> Outcome:
    """Emits token t = pieces[t] in order, `groups[i]` tokens per record (one by default)."""
    tokenizer = PieceTokenizer(pieces)
    emission = ChoiceEmission(0, SamplingParams(), tokenizer, logprobs=True)
    parser = choice_parser(0, config)
    sizes = list(groups) if groups is not None else [1] * len(pieces)
    raw, parsed, first = [], [], 0
    for number, size in enumerate(sizes):
        tokens = tuple(range(first, first + size))
        first += size
        finish = Finish.LENGTH if number == len(sizes) - 1 else Finish.NONE
        record = CompletionRecord(1, 1, Role.SAMPLE, tokens, finish=finish)
        delta = emission.advance(record, tuple(position(t) for t in tokens))
        raw.append(delta)
        parsed.append(parser.feed(delta))
    return Outcome(raw, parsed)


def tokens(*pieces: str) -> list[bytes]:
    return [p.encode() for p in pieces]


class TestReasoning:
    def test_deepseek_splits_reasoning_from_the_answer_and_gives_only_answer_tokens_entries(self):
        out = run(tokens("<think>", "Hm", "m.", "</think>", "\n\n", "Yes", "!"), DEEPSEEK)

        assert (out.reasoning, out.content) == ("Hmm.", "Yes!")
        assert out.entry_ids == [5, 6]
        assert [e.text_offset for e in out.entries] == [0, 3]

    def test_deepseek_reads_output_without_a_start_string_as_reasoning_from_the_first_token(self):
        out = run(tokens("Hm", "m", "</think>", "ok"), DEEPSEEK)

        assert (out.reasoning, out.content) == ("Hmm", "ok")
        assert out.entry_ids == [3]

    def test_unclosed_reasoning_stays_reasoning_and_gives_no_entries(self):
        out = run(tokens("<think>", "still ", "thinking"), DEEPSEEK)

        assert (out.reasoning, out.content, out.entries) == ("still thinking", "", [])

    def test_qwen3_reads_output_without_a_start_string_as_content(self):
        out = run(tokens("Plain", " answer", "</think>"), QWEN)

        assert (out.reasoning, out.content) == ("", "Plain answer</think>")
        assert out.entry_ids == [0, 1, 2]

    def test_qwen3_reads_output_as_reasoning_when_the_prompt_opened_the_block(self):
        config = ParserConfig(reasoning_parser="qwen3", prompt_in_reasoning=True)
        out = run(tokens("why", "</think>", "because"), config)

        assert (out.reasoning, out.content, out.entry_ids) == ("why", "because", [2])

    def test_whitespace_stripped_after_the_end_string_gives_its_tokens_no_entries(self):
        out = run(tokens("<think>", "a", "</think>", " \n", " b", "c"), DEEPSEEK)

        # " b" starts in the stripped whitespace: its "b" is content without an entry.
        assert out.content == "bc"
        assert out.entry_ids == [5]
        assert [e.text_offset for e in out.entries] == [1]

    def test_a_token_spanning_the_end_string_and_the_answer_gives_no_entry(self):
        # Its first character is the end string's: the answer text it carries has no entry.
        out = run(tokens("<think>", "a</thi", "nk>Yes", " sir"), DEEPSEEK)

        assert (out.reasoning, out.content) == ("a", "Yes sir")
        assert out.entry_ids == [3]
        assert out.entries[0].text_offset == 3

    def test_a_partial_end_string_is_held_then_released_as_reasoning_when_it_is_not_one(self):
        out = run(tokens("<think>", "a</th", "ink", "</think>", "b"), DEEPSEEK)

        assert out.parsed[1].reasoning == "a"  # "</th" waits
        assert (out.reasoning, out.content) == ("a</think", "b")

    def test_no_parser_passes_deltas_through_with_their_entries_and_offsets(self):
        out = run(tokens("<think>", "a", "</think>", "b"), ParserConfig())

        assert out.content == "<think>a</think>b" and out.reasoning == ""
        assert [p.content_logprobs for p in out.parsed] == [r.logprobs for r in out.raw]


class TestHermes:
    CALL = '{"name": "get_weather", "arguments": {"city": "Zürich"}}'

    def test_calls_after_content_become_tool_calls_and_their_tokens_get_no_entries(self):
        pieces = tokens("Let me ", "check.", "<tool_call>", self.CALL, "</tool_call>", "\n")
        pieces += tokens("<tool_call>", '{"name": "now"}', "</tool_call>")
        out = run(pieces, HERMES)

        assert out.content == "Let me check."
        assert out.entry_ids == [0, 1]
        assert out.calls() == [("get_weather", '{"city": "Zürich"}'), ("now", "{}")]

    def test_a_call_is_announced_once_with_its_whole_arguments_when_it_closes(self):
        out = run(
            tokens("<tool_call>", '{"name": "f", ', '"arguments": {}}', "</tool_call>"), HERMES
        )

        announced = [(i, p.tool_calls) for i, p in enumerate(out.parsed) if p.tool_calls]
        assert len(announced) == 1 and announced[0][0] == 3
        assert announced[0][1][0].id is not None and announced[0][1][0].name == "f"

    def test_a_call_that_is_not_json_stays_content_with_its_entries(self):
        out = run(tokens("<tool_call>", "oops", "</tool_call>"), HERMES)

        assert out.content == "<tool_call>oops</tool_call>"
        assert (out.calls(), out.entry_ids) == ([], [0, 1, 2])

    def test_a_call_cut_short_stays_content(self):
        out = run(tokens("<tool_call>", '{"name": "f"'), HERMES)

        assert (out.content, out.calls()) == ('<tool_call>{"name": "f"', [])

    def test_text_after_the_calls_is_content_with_entries(self):
        out = run(tokens("<tool_call>", '{"name": "f"}', "</tool_call>", " done"), HERMES)

        assert out.content == " done" and out.entry_ids == [3]

    def test_tool_calls_inside_reasoning_are_reasoning(self):
        out = run(tokens("<think>", "<tool_call>", self.CALL, "</tool_call>", "</think>"), BOTH)

        assert out.calls() == [] and out.reasoning == f"<tool_call>{self.CALL}</tool_call>"

    def test_without_tools_the_call_syntax_is_plain_content(self):
        config = ParserConfig(tool_call_parser="hermes", tools=False)
        out = run(tokens("<tool_call>", self.CALL, "</tool_call>"), config)

        assert out.content == f"<tool_call>{self.CALL}</tool_call>"
        assert out.entry_ids == [0, 1, 2]


class TestForcedCalls:
    NAMED = ToolCallMode((("f", {"type": "object"}),), named="f")
    REQUIRED = ToolCallMode((("f", {"type": "object"}), ("g", {"type": "object"})))

    @pytest.mark.parametrize(
        "config", [ParserConfig(), ParserConfig(tool_call_parser="hermes"), QWEN]
    )
    def test_a_named_calls_output_is_its_arguments_and_its_tokens_get_no_entries(self, config):
        out = run(tokens('{"a"', ": 2", "}"), dataclasses.replace(config, forced=self.NAMED))

        assert out.calls() == [("f", '{"a": 2}')]
        assert (out.content, out.entries) == ("", [])

    def test_a_required_call_is_announced_when_its_name_closes(self):
        pieces = tokens('[{"name": "g", ', '"parameters": {', '"b": 1}}]')
        out = run(pieces, ParserConfig(forced=self.REQUIRED))

        assert out.parsed[0].tool_calls[0].name == "g"
        assert out.calls() == [("g", '{"b": 1}')]
        assert (out.content, out.entries) == ("", [])

    @pytest.mark.parametrize(
        "config",
        [
            ParserConfig(reasoning_parser="deepseek_r1"),
            ParserConfig(reasoning_parser="qwen3"),
            ParserConfig(reasoning_parser="qwen3", prompt_in_reasoning=True),
            ParserConfig(reasoning_parser="deepseek_r1", tool_call_parser="hermes"),
        ],
    )
    def test_the_call_is_read_from_the_content_after_the_reasoning(self, config):
        pieces = tokens("<think>", "hm", "</think>", "\n", '{"a"', ": 2}")

        out = run(pieces, dataclasses.replace(config, forced=self.NAMED))

        assert out.reasoning == "hm"
        assert out.calls() == [("f", '{"a": 2}')]
        assert (out.content, out.entries) == ("", [])

    def test_the_finish_and_the_reasoning_count_pass_through(self):
        config = ParserConfig(reasoning_parser="deepseek_r1", forced=self.NAMED)
        pieces = tokens("hm", "</think>", "{}")

        out = run(pieces, config)

        assert out.parsed[-1].finish_reason == "length"
        assert sum(p.reasoning_tokens for p in out.parsed) == 1

    def test_a_whole_answer_cut_short_stays_content_with_its_entries(self):
        out = run(tokens("<think>", "hm", "</think>", '[{"name": '), QWEN)
        merged = out.raw[0]
        for delta in out.raw[1:]:
            merged = merged.merge(delta)
        parsed = choice_parser(0, QWEN).feed(merged)

        answer = whole_forced_answer(parsed, self.REQUIRED)

        assert answer == parsed
        assert (answer.content, [e.position.chosen.token_id for e in answer.content_logprobs]) == (
            '[{"name": ',
            [3],
        )

    def test_a_whole_answer_that_completes_the_json_is_the_calls_without_entries(self):
        out = run(tokens('[{"name": "f", "parameters": {}}]'), ParserConfig())
        parsed = choice_parser(0, ParserConfig()).feed(out.raw[0])

        answer = whole_forced_answer(parsed, self.REQUIRED)

        assert [(c.name, c.arguments) for c in answer.tool_calls] == [("f", "{}")]
        assert (answer.content, answer.content_logprobs) == ("", ())


def test_unknown_parser_names_are_rejected():
    with pytest.raises(ValueError, match="reasoning parser"):
        ParserConfig(reasoning_parser="mystery")
    with pytest.raises(ValueError, match="tool-call parser"):
        ParserConfig(tool_call_parser="mystery")


# The property: output built from labelled parts, cut into tokens at random byte positions
# (multi-byte characters split included) and into records at random, is parsed into exactly
# those parts, and a token's entry goes to content exactly when its first byte is content's.

_TEXT = st.text(alphabet="ab é€😀ж\n{}", max_size=12)


@st.composite
def labelled_outputs(draw) -> list[tuple[str, Part]]:
    parts: list[tuple[str, Part]] = []
    if draw(st.booleans()):
        parts.append(("<think>", Part.DELIMITER))
    parts.append((draw(_TEXT), Part.REASONING))
    parts.append(("</think>", Part.DELIMITER))
    parts.append((draw(st.text(alphabet=" \n", max_size=3)), Part.STRIPPED))
    content = draw(_TEXT)
    if content[:1].isspace():
        content = "x" + content
    parts.append((content, Part.CONTENT))
    for number in range(draw(st.integers(0, 2))):
        if number:
            parts.append((draw(st.text(alphabet=" \n", max_size=2)), Part.STRIPPED))
        arguments = {"v": draw(_TEXT)}
        body = json.dumps({"name": f"f{number}", "arguments": arguments}, ensure_ascii=False)
        parts += [("<tool_call>", Part.DELIMITER), (body, Part.TOOL)]
        parts.append(("</tool_call>", Part.DELIMITER))
    return [(text, kind) for text, kind in parts if text]


@st.composite
def cut_outputs(draw):
    parts = draw(labelled_outputs())
    data = "".join(text for text, _ in parts).encode()
    boundaries = set()
    offset = 0
    for text, _ in parts:
        offset += len(text.encode())
        boundaries.add(offset)
    cuts = (
        draw(st.sets(st.integers(1, len(data) - 1), max_size=len(data))) if len(data) > 1 else set()
    )
    aligned = draw(st.booleans())
    if aligned:
        cuts |= boundaries - {len(data)}
    edges = [0, *sorted(cuts), len(data)]
    pieces = [data[a:b] for a, b in zip(edges, edges[1:], strict=False)]
    sizes = []
    left = len(pieces)
    while left:
        size = draw(st.integers(1, min(left, 4)))
        sizes.append(size)
        left -= size
    return parts, pieces, sizes, aligned


@settings(max_examples=300, deadline=None)
@given(cut_outputs())
def test_random_token_splits_never_misattribute_an_entry(case):
    parts, pieces, sizes, aligned = case
    out = run(pieces, BOTH, sizes)

    def joined(kind: Part) -> str:
        return "".join(text for text, k in parts if k is kind)

    assert out.reasoning == joined(Part.REASONING)
    assert out.content == joined(Part.CONTENT)
    calls = [json.loads(text) for text, kind in parts if kind is Part.TOOL]
    assert out.calls() == [
        (c["name"], json.dumps(c["arguments"], ensure_ascii=False)) for c in calls
    ]
    # The kind of every byte, and the content offset of every content byte's character.
    byte_kinds: list[Part] = []
    byte_content_char: list[int] = []
    content_chars = 0
    for text, kind in parts:
        for char in text:
            size = len(char.encode())
            byte_kinds += [kind] * size
            byte_content_char += [content_chars] * size
            content_chars += kind is Part.CONTENT
    expected, start = [], 0
    for token_id, piece in enumerate(pieces):
        if byte_kinds[start] is Part.CONTENT:
            expected.append((token_id, byte_content_char[start]))
        start += len(piece)
    assert [(e.position.chosen.token_id, e.text_offset) for e in out.entries] == expected
    if aligned:  # tokens inside parts: the entries' bytes are exactly the content's
        assert b"".join(pieces[t] for t in out.entry_ids) == out.content.encode()
    # Streaming and whole: the same parse from the merged delta.
    merged = out.raw[0]
    for delta in out.raw[1:]:
        merged = merged.merge(delta)
    whole = choice_parser(0, BOTH).feed(merged)
    assert (whole.reasoning, whole.content) == (out.reasoning, out.content)
    assert list(whole.content_logprobs) == out.entries
