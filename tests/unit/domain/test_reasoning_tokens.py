"""Reasoning-token counts: the tokens whose first character lies in reasoning, without logprobs."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from domain.contract.records import CompletionRecord, Finish, Role
from domain.emission.choice import ChoiceEmission
from domain.emission.outputs import ChoiceDelta
from domain.logprobs.values import PositionLogprobs, TokenLogprob
from domain.parsers.build import choice_parser
from domain.parsers.parsed import ParsedDelta, ParserConfig
from domain.requests.sampling import SamplingParams

DEEPSEEK = ParserConfig(reasoning_parser="deepseek_r1")
QWEN = ParserConfig(reasoning_parser="qwen3")
EOS = 99


class PieceTokenizer:
    """Token t is `pieces[t]`, and token 99 is an EOS with no text."""

    eos_token_ids = frozenset({EOS})
    special_token_ids = frozenset({EOS})
    strips_leading_space = False

    def __init__(self, pieces: Sequence[bytes]) -> None:
        self._pieces = pieces

    def token_bytes(self, token_id: int) -> bytes:
        return b"" if token_id == EOS else self._pieces[token_id]


def emit(
    pieces: Sequence[str | bytes],
    config: ParserConfig,
    *,
    groups: Sequence[int] | None = None,
    finish: Finish = Finish.LENGTH,
    eos: bool = False,
    forced: Sequence[int] = (),
    logprobs: bool = False,
) -> tuple[list[ChoiceDelta], list[ParsedDelta]]:
    """Emits token t = pieces[t] in order, `groups[i]` tokens per record (one by default), then
    EOS when `eos`; the tokens in `forced` are forced. The last record ends with `finish`."""
    raw_pieces = [p.encode() if isinstance(p, str) else p for p in pieces]
    emission = ChoiceEmission(0, SamplingParams(), PieceTokenizer(raw_pieces), logprobs=logprobs)
    parser = choice_parser(0, config)
    token_ids = [*range(len(raw_pieces)), *([EOS] if eos else [])]
    sizes = list(groups) if groups is not None else [1] * len(token_ids)
    assert sum(sizes) == len(token_ids)
    raw, parsed, first = [], [], 0
    for number, size in enumerate(sizes):
        tokens = tuple(token_ids[first : first + size])
        mask = sum(1 << (t - first) for t in forced if first <= t < first + size)
        first += size
        end = finish if number == len(sizes) - 1 else Finish.NONE
        record = CompletionRecord(1, 1, Role.SAMPLE, tokens, forced_mask=mask, finish=end)
        payload = tuple(PositionLogprobs(TokenLogprob(t, -1.0)) for t in tokens)
        delta = emission.advance(record, payload if logprobs else None)
        raw.append(delta)
        parsed.append(parser.feed(delta))
    return raw, parsed


def count(pieces: Sequence[str | bytes], config: ParserConfig = DEEPSEEK, **options: object) -> int:
    _, parsed = emit(pieces, config, **options)  # type: ignore[arg-type]
    return sum(p.reasoning_tokens for p in parsed)


def test_every_emitted_token_gets_its_first_character_offset_without_logprobs():
    # "é" arrives as two byte tokens: the second points at the character the first began.
    raw, _ = emit(["ab", b"\xc3", b"\xa9", "c"], DEEPSEEK, groups=[2, 2])

    # Offsets go out with their token's first character: the held byte's waits for "é".
    assert [d.text_offsets for d in raw] == [(0,), (2, 2, 3)]
    assert "".join(d.text for d in raw) == "ab\xe9c"
    assert all(d.logprobs == () for d in raw)


def test_the_markers_and_the_answer_are_not_reasoning_tokens():
    assert count(["<think>", "Hm", "m.", "</think>", "\n\n", "Yes", "!"]) == 2


def test_a_token_split_across_the_end_string_belongs_to_the_part_of_its_first_character():
    # "b</th" starts in reasoning; "ink>Yes" starts in the end string and carries the answer.
    assert count(["<think>", "a", "b</th", "ink>Yes", " sir"]) == 2
    # A token whose text closes the block and opens the answer starts in reasoning too.
    assert count(["<think>", "a", "b</think>Yes"]) == 2


def test_whitespace_stripped_after_the_end_string_is_not_reasoning():
    # " b" starts in the stripped whitespace, "\n " is stripped whitespace.
    assert count(["<think>", "a", " ", "</think>", "\n ", " b", "c"]) == 2


def test_a_block_that_never_closes_counts_every_token_after_the_start_string():
    assert count(["<think>", "still ", "thinking"]) == 2
    # A partial end string cut off by the token limit is reasoning text, so its tokens count.
    assert count(["<think>", "a", "</th"]) == 2


def test_deepseek_r1_counts_from_the_first_token_when_the_output_starts_inside_reasoning():
    assert count(["Hm", "m", "</think>", "ok"]) == 2


def test_qwen3_without_a_start_string_has_no_reasoning_tokens():
    assert count(["Plain", " answer", "</think>", "more"], QWEN) == 0
    assert count(["<think>", "why", "</think>", "because"], QWEN) == 1


def test_qwen3_counts_from_the_first_token_when_the_prompt_opened_the_block():
    config = ParserConfig(reasoning_parser="qwen3", prompt_in_reasoning=True)

    assert count(["why", " so", "</think>", "because"], config) == 2


def test_without_a_reasoning_parser_nothing_is_reasoning():
    tools_only = ParserConfig(tool_call_parser="hermes", tools=True)

    assert count(["<think>", "a", "</think>", "b"], ParserConfig()) == 0
    assert count(["<think>", "a", "</think>", "b"], tools_only) == 0


def test_a_textless_eos_is_reasoning_only_while_the_block_is_open():
    inside = count(["<think>", "a"], eos=True, finish=Finish.STOP_TOKEN)
    at_once = count(["<think>"], eos=True, finish=Finish.STOP_TOKEN)
    after = count(["<think>", "a", "</think>"], eos=True, finish=Finish.STOP_TOKEN)
    answered = count(["<think>", "a", "</think>", "b"], eos=True, finish=Finish.STOP_TOKEN)

    assert (inside, at_once, after, answered) == (2, 1, 1, 1)


def test_a_token_held_as_a_possible_end_string_is_counted_once_it_is_decided():
    _, parsed = emit(["<think>", "a", "</th", "ink", "</think>", "b"], DEEPSEEK)

    # "</th" and "ink" may still be the end string until the real one arrives after them.
    assert [p.reasoning_tokens for p in parsed] == [0, 1, 0, 0, 2, 0]
    assert "".join(p.reasoning for p in parsed) == "a</think"


def test_forced_end_tokens_of_a_thinking_budget_are_markers_and_not_reasoning():
    # The budget forced the end string's two tokens; they have no entries but are counted by
    # where their text lies, as vLLM counts token IDs between the markers.
    pieces = ["<think>", "a", "b", "</th", "ink>", "ok"]

    closed = count(pieces, forced=[3, 4], logprobs=True)
    cut = count(pieces[:4], forced=[3], logprobs=True)

    assert (closed, cut) == (2, 3)


_REASONING = st.sampled_from([b"a", b" ", b"\n", b"xy", b"\xc3", b"\xa9", b"\xe2\x82", b"\xac"])
_CONTENT = st.sampled_from([b"b", b" ", b"\n", b"cd", b"\xc3\xa9"])


@settings(max_examples=200, deadline=None)
@given(
    opened=st.booleans(),
    reasoning=st.lists(_REASONING, max_size=8),
    closed=st.booleans(),
    content=st.lists(_CONTENT, max_size=5),
    cuts=st.lists(st.integers(1, 4), max_size=10),
    eos=st.booleans(),
)
def test_the_count_is_the_tokens_between_the_markers_however_the_output_is_split(
    opened, reasoning, closed, content, cuts, eos
):
    # With single-token markers, the first-character rule is vLLM's count of the token IDs
    # between the start and end markers (from the first token without a start marker).
    pieces = [*([b"<think>"] if opened else []), *reasoning]
    if closed:
        pieces += [b"</think>", *content]
    groups: list[int] = []
    left = len(pieces) + eos
    for cut in cuts:
        if left:
            groups.append(min(cut, left))
            left -= groups[-1]
    if left:
        groups.append(left)
    finish = Finish.STOP_TOKEN if eos else Finish.LENGTH
    expected = len(reasoning) + (1 if eos and not closed else 0)

    found = count(pieces, groups=groups or None, eos=eos, finish=finish)

    assert found == expected
