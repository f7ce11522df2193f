"""The text-offset rule, as a property over split and invalid UTF-8 (contracts/api.md, "Text
offsets"): an entry's `text_offset` is the index, in the choice's final text, of the character
that holds the token's first byte."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import example, given, settings
from hypothesis import strategies as st

from domain.contract.records import CompletionRecord, Finish, Role
from domain.emission.choice import ChoiceEmission
from domain.emission.outputs import ChoiceDelta
from domain.logprobs.values import PositionLogprobs, TokenLogprob
from domain.parsers.build import choice_parser
from domain.parsers.hermes import TOOL_CALL_END, TOOL_CALL_START, parse_call
from domain.parsers.parsed import ParserConfig
from domain.requests.sampling import SamplingParams
from tests.support.text_offsets import char_index, character_starts

EMOJI = "\U0001f600".encode()  # F0 9F 98 80
CJK = "\u4e2d".encode()  # E4 B8 AD
ACUTE = "\u00e9".encode()  # C3 A9
REPLACEMENT = "\ufffd".encode()  # EF BF BD: a literal U+FFFD the model writes
CALL = b'<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'

# A byte-level vocabulary: token i spells PIECES[i]; 0 is the EOS, 1 a skipped special token.
PIECES: tuple[bytes, ...] = (
    b"</s>",
    b"<|x|>",
    b"a",
    b"b",
    b" ",
    b"\n",
    ACUTE[:1],
    ACUTE[1:],
    CJK[:1],
    CJK[1:],
    CJK[:2],
    CJK[2:],
    EMOJI[:1],
    EMOJI[1:3],
    EMOJI[3:],
    EMOJI[:2],
    EMOJI[2:],
    CJK[2:] + EMOJI[:1],  # ends one character and starts another
    ACUTE + CJK[:1],
    b"\x80",  # lone continuation bytes
    b"\xbf",
    b"\xc0\xaf",  # overlong encodings
    b"\xe0\x80\xaf",
    b"\xc1",
    b"\xe2\x82",  # truncated sequences
    EMOJI[:3],
    b"\xed\xa0\x80",  # a surrogate half
    b"\xff",
    REPLACEMENT,
    REPLACEMENT[:1],
    REPLACEMENT[1:],
    b"<think>",
    b"</think>",
    b"</th",
    b"ink>\n",
    CALL,
    CALL[:15],
    CALL[15:],
    b"<tool_call>{oops}</tool_call>",
)
EOS, SPECIAL = 0, 1
STOPS = ("\u4e2d", "\ufffd", "b\u00e9", "\U0001f600a", "ab", "\n")


class PieceTokenizer:
    """The `Tokenizer` port's decoding half over `PIECES`."""

    eos_token_ids = frozenset({EOS})
    special_token_ids = frozenset({EOS, SPECIAL})
    strips_leading_space = False

    def token_bytes(self, token_id: int) -> bytes:
        return PIECES[token_id]


@dataclass(frozen=True)
class Case:
    tokens: tuple[int, ...]
    cuts: tuple[int, ...]  # record boundaries of the streamed run
    stop_token: bool  # the last token is a terminating EOS
    stop: tuple[str, ...]
    include_stop: bool
    skip_special: bool
    echo: bool


@st.composite
def cases(draw: st.DrawFn) -> Case:
    tokens = draw(st.lists(st.integers(1, len(PIECES) - 1), max_size=24))
    stop_token = draw(st.booleans())
    if stop_token:
        tokens.append(EOS)
    if not tokens:
        tokens.append(draw(st.integers(1, len(PIECES) - 1)))
    cuts = draw(st.lists(st.integers(1, len(tokens)), max_size=6))
    return Case(
        tuple(tokens),
        tuple(sorted(set(cuts))),
        stop_token,
        tuple(draw(st.lists(st.sampled_from(STOPS), max_size=2))),
        draw(st.booleans()),
        draw(st.booleans()),
        draw(st.booleans()),
    )


def _position(token_id: int) -> PositionLogprobs:
    return PositionLogprobs(TokenLogprob(token_id, -1.0 - token_id), ())


def _run(case: Case, bounds: list[int]) -> list[ChoiceDelta]:
    """The choice's deltas when the tokens arrive in records split at `bounds`."""
    params = SamplingParams(
        stop=case.stop,
        include_stop_str_in_output=case.include_stop,
        skip_special_tokens=case.skip_special,
    )
    choice = ChoiceEmission(0, params, PieceTokenizer(), logprobs=True, echo=case.echo)
    deltas = []
    edges = [0, *[b for b in bounds if b < len(case.tokens)], len(case.tokens)]
    for start, end in zip(edges, edges[1:], strict=False):
        tokens = case.tokens[start:end]
        last = end == len(case.tokens)
        finish = Finish.NONE
        if last:
            finish = Finish.STOP_TOKEN if case.stop_token else Finish.LENGTH
        record = CompletionRecord(1, 1, Role.SAMPLE, tokens, finish=finish)
        deltas.append(choice.advance(record, tuple(_position(t) for t in tokens)))
        if deltas[-1].finished:
            break
    return deltas


def _merged(deltas: list[ChoiceDelta]) -> ChoiceDelta:
    whole = deltas[0]
    for delta in deltas[1:]:
        whole = whole.merge(delta)
    return whole


def _expected_offsets(case: Case, kept: tuple[int, ...]) -> tuple[bytes, list[int]]:
    """The decoded bytes, and the offset by the rule of each kept token that adds them (all
    but a terminating stop token whose text is not included)."""
    pushed = list(kept)
    if case.stop_token and kept and kept[-1] == EOS and not case.include_stop:
        pushed.pop()  # a terminating stop token adds no bytes unless its text is included
    pieces = [
        b"" if case.skip_special and t in PieceTokenizer.special_token_ids else PIECES[t]
        for t in pushed
    ]
    data = b"".join(pieces)
    offsets, position = [], 0
    for piece in pieces:
        # A token with no bytes lands where the next byte does, or at the end.
        offsets.append(char_index(data, position))
        position += len(piece)
    return data, offsets


@settings(max_examples=300, deadline=None)
@given(cases())
# A stop string that ends inside a token: the token completing U+4E2D starts an emoji.
@example(Case((2, 8, 17, 13, 14), (2,), False, ("\u4e2d",), False, True, False))
@example(Case((2, 8, 17, 13, 14), (2,), False, ("\u4e2d",), True, True, True))
# An included stop token whose text breaks a held prefix into the U+FFFD stop string.
@example(Case((2, 24, 0), (), True, ("\ufffd",), True, False, False))
def test_offsets_index_the_final_text_under_split_and_invalid_utf8(case: Case) -> None:
    whole = _merged(_run(case, []))
    streamed = _merged(_run(case, list(case.cuts)))
    assert streamed == whole, "streamed deltas concatenate to the whole choice"

    text, kept = whole.text, whole.token_ids
    data, expected = _expected_offsets(case, kept)
    full = data.decode("utf-8", errors="replace")
    stopped = whole.stop_reason is not None and isinstance(whole.stop_reason, str)
    if stopped:
        assert full.startswith(text)
    else:
        assert text == full

    # A token after the start of a stop string, and a terminating stop token (no text), point
    # at the end of the text.
    expected = [min(offset, len(text)) for offset in expected]
    if len(expected) < len(kept):
        expected.append(len(text))
    # Every token's offset, with or without an entry.
    assert list(whole.text_offsets) == expected
    assert list(whole.text_offsets) == sorted(whole.text_offsets)

    entries = [(e.position.chosen.token_id, e.text_offset) for e in whole.logprobs]
    offsets = [offset for _, offset in entries]
    assert offsets == sorted(offsets)
    assert all(0 <= offset <= len(text) for offset in offsets)
    if case.echo:
        wanted = list(zip(kept, expected, strict=True))
    else:
        # Terminating stop tokens have no entry; after a stop string only tokens that start
        # in the returned text do.
        ends = case.stop_token and not stopped
        wanted = [
            (t, o)
            for index, (t, o) in enumerate(zip(kept, expected, strict=True))
            if (o < len(text) or not stopped) and not (ends and index == len(kept) - 1)
        ]
    assert entries == wanted

    ends = case.stop_token and not stopped and case.include_stop
    if not case.echo and not stopped and not ends:
        # The entries' bytes are the output's bytes (an included stop token's text has no
        # entry, as a terminating stop token never has one), and slicing at consecutive
        # offsets gives each token the characters whose first byte it holds.
        spelled = b"".join(
            b"" if case.skip_special and t in PieceTokenizer.special_token_ids else PIECES[t]
            for t, _ in entries
        )
        assert spelled == data
        starts = character_starts(data)
        bounds = [*offsets, len(text)]
        for (token_id, _), start, end in zip(entries, bounds, bounds[1:], strict=False):
            piece = data[starts[start] : starts[end]].decode("utf-8", errors="replace")
            assert text[start:end] == piece, token_id


# --- parser attribution --------------------------------------------------------------------


def _content_ranges(text: str) -> list[tuple[int, int]]:
    """Where content lies in a qwen3 + hermes output, by the parsers' documented rules."""
    position = 0
    if text.startswith("<think>"):
        end = text.find("</think>", len("<think>"))
        if end < 0:
            return []
        position = end + len("</think>")
        position += len(text[position:]) - len(text[position:].lstrip())
    ranges = []
    while True:
        start = text.find(TOOL_CALL_START, position)
        end = text.find(TOOL_CALL_END, start + len(TOOL_CALL_START)) if start >= 0 else -1
        if end < 0:
            ranges.append((position, len(text)))
            return ranges
        after = end + len(TOOL_CALL_END)
        if parse_call(text[start + len(TOOL_CALL_START) : end]) is None:
            ranges.append((position, after))
            position = after
            continue
        ranges.append((position, start))
        space = len(text[after:]) - len(text[after:].lstrip())
        rest = text[after + space :]
        position = after + space if not rest or rest.startswith(TOOL_CALL_START) else after


def _parsed_entries(deltas: list[ChoiceDelta]) -> tuple[str, list[tuple[int, int]]]:
    config = ParserConfig(reasoning_parser="qwen3", tool_call_parser="hermes", tools=True)
    parser = choice_parser(0, config)
    content, entries = "", []
    for delta in deltas:
        parsed = parser.feed(delta)
        content += parsed.content
        entries += [(e.position.chosen.token_id, e.text_offset) for e in parsed.content_logprobs]
    return content, entries


_PLAIN = (False, True, False)  # include_stop, skip_special, echo


@settings(max_examples=300, deadline=None)
@given(cases())
# Reasoning with a split character, the end marker split across tokens, then content with a
# split emoji, a literal U+FFFD and a call; and a call whose tokens split its markers.
@example(Case((31, 8, 9, 33, 34, 12, 13, 14, 28, 35, 4, 2), (2, 5, 9), False, (), *_PLAIN))
@example(Case((2, 36, 37, 4, 24, 2, 0), (1, 2, 4), True, (), *_PLAIN))
def test_parsed_content_entries_are_the_tokens_whose_first_byte_lies_in_content(
    case: Case,
) -> None:
    case = Case(case.tokens, case.cuts, case.stop_token, (), False, True, False)
    deltas = _run(case, list(case.cuts))
    whole = _merged(deltas)
    content, entries = _parsed_entries([whole])
    assert _parsed_entries(deltas) == (content, entries), "streamed parsing equals whole"

    text = whole.text
    ranges = [(start, end) for start, end in _content_ranges(text) if end > start]
    assert "".join(text[start:end] for start, end in ranges) == content
    wanted = []
    for entry in whole.logprobs:
        offset, at = entry.text_offset, 0
        for start, end in ranges:
            if start <= offset < end:
                wanted.append((entry.position.chosen.token_id, at + offset - start))
                break
            at += end - start
        else:
            if offset >= len(text) and ranges and ranges[-1][1] == len(text):
                wanted.append((entry.position.chosen.token_id, len(content)))
    assert entries == wanted
    assert all(0 <= offset <= len(content) for _, offset in entries)
