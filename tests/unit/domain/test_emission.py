"""Emission rules: which tokens get logprob entries, when they are released, and their offsets."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain.common.errors import LogprobDataError
from domain.contract.records import CompletionRecord, Finish, Role
from domain.emission.choice import ChoiceEmission
from domain.logprobs.values import PositionLogprobs, TokenLogprob
from domain.requests.sampling import SamplingParams

EOS = 0
PIECES = {EOS: b"</s>", 1: b"ab", 2: b"c", 3: b"\xe2\x82", 4: b"\xac!", 5: b"x", 6: b"yz"}


class TableTokenizer:
    """Token bytes from a table; 0 is a special EOS. 3 + 4 spell the euro sign and '!'."""

    eos_token_ids = frozenset({EOS})
    special_token_ids = frozenset({EOS})
    strips_leading_space = False

    def token_bytes(self, token_id: int) -> bytes:
        return PIECES[token_id]


def position(token_id: int) -> PositionLogprobs:
    return PositionLogprobs(TokenLogprob(token_id, -0.5 - token_id), (TokenLogprob(9, -1.0),))


def emission(*, echo: bool = False, **params) -> ChoiceEmission:
    return ChoiceEmission(0, SamplingParams(**params), TableTokenizer(), logprobs=True, echo=echo)


def sampled(token_id: int, finish: Finish = Finish.NONE) -> CompletionRecord:
    return CompletionRecord(1, 1, Role.SAMPLE, (token_id,), finish=finish)


def run(tokens: list[int], finish_last: Finish = Finish.NONE, *, echo: bool = False, **params):
    choice = emission(echo=echo, **params)
    deltas = []
    for index, token_id in enumerate(tokens):
        finish = finish_last if index == len(tokens) - 1 else Finish.NONE
        deltas.append(choice.advance(sampled(token_id, finish), (position(token_id),)))
        if deltas[-1].finished:
            break
    return deltas


def entries(deltas) -> list[tuple[int, int]]:
    return [(e.position.chosen.token_id, e.text_offset) for d in deltas for e in d.logprobs]


def test_every_token_gets_an_entry_at_the_offset_of_its_first_character():
    deltas = run([1, 2, 3, 4, 5], Finish.LENGTH)

    assert "".join(d.text for d in deltas) == "abc€!x"
    assert entries(deltas) == [(1, 0), (2, 2), (3, 3), (4, 3), (5, 5)]


def test_a_terminating_eos_has_no_entry_but_stays_in_the_tokens():
    deltas = run([1, 2, EOS], Finish.STOP_TOKEN)

    assert [t for d in deltas for t in d.token_ids] == [1, 2, EOS]
    assert entries(deltas) == [(1, 0), (2, 2)]
    assert deltas[-1].finish_reason == "stop" and deltas[-1].stop_reason is None


def test_an_ignored_eos_keeps_its_entry_in_generation_order():
    deltas = run([1, EOS, 2], Finish.LENGTH, ignore_eos=True)

    assert entries(deltas) == [(1, 0), (EOS, 2), (2, 2)]
    assert "".join(d.text for d in deltas) == "abc"


def test_after_a_stop_string_only_tokens_starting_before_it_keep_entries():
    deltas = run([1, 2, 5, 6, 1], stop=("cx",))

    assert "".join(d.text for d in deltas) == "ab"
    assert entries(deltas) == [(1, 0)]
    assert deltas[-1].stop_reason == "cx"


def test_a_token_partly_before_the_stop_keeps_its_entry():
    deltas = run([1, 6, 1], stop=("z",))

    assert "".join(d.text for d in deltas) == "aby"
    assert entries(deltas) == [(1, 0), (6, 2)]


def test_entries_are_held_back_with_text_that_may_start_a_stop():
    deltas = run([1, 2, 5], stop=("cq",))

    assert deltas[1].text == "" and deltas[1].logprobs == ()
    assert entries(deltas[2:]) == [(2, 2), (5, 3)]
    assert deltas[2].text == "cx"


def test_included_stop_strings_keep_the_entries_of_the_tokens_forming_them():
    deltas = run([1, 2, 5], stop=("cx",), include_stop_str_in_output=True)

    assert "".join(d.text for d in deltas) == "abcx"
    assert entries(deltas) == [(1, 0), (2, 2), (5, 3)]


def test_a_forced_token_has_no_entry_and_the_payload_must_name_the_emitted_tokens():
    record = CompletionRecord(1, 1, Role.SPECULATIVE, (5, 6), forced_mask=0b10)

    delta = emission().advance(record, (position(5), position(6)))

    assert [e.position for e in delta.logprobs] == [position(5)]
    assert delta.token_ids == (5, 6) and delta.text == "xyz"


def test_with_echo_a_terminating_eos_has_an_entry_at_the_end_of_the_text():
    deltas = run([1, 2, EOS], Finish.STOP_TOKEN, echo=True)

    assert "".join(d.text for d in deltas) == "abc"
    assert entries(deltas) == [(1, 0), (2, 2), (EOS, 3)]
    assert deltas[-1].finish_reason == "stop" and deltas[-1].stop_reason is None


def test_with_echo_a_first_token_eos_is_the_only_entry():
    deltas = run([EOS], Finish.STOP_TOKEN, echo=True)

    assert entries(deltas) == [(EOS, 0)]
    assert deltas[-1].token_ids == (EOS,)


def test_with_echo_a_terminating_stop_token_id_has_an_entry():
    deltas = run([1, 5], Finish.STOP_TOKEN, echo=True, stop_token_ids=(5,))

    assert "".join(d.text for d in deltas) == "ab"
    assert entries(deltas) == [(1, 0), (5, 2)]
    assert deltas[-1].stop_reason == 5


def test_with_echo_an_included_stop_token_keeps_the_offset_of_its_text():
    deltas = run(
        [1, 5], Finish.STOP_TOKEN, echo=True, stop_token_ids=(5,), include_stop_str_in_output=True
    )

    assert "".join(d.text for d in deltas) == "abx"
    assert entries(deltas) == [(1, 0), (5, 2)]


def test_with_echo_tokens_at_a_stop_string_keep_entries_pointing_at_the_end_of_the_text():
    deltas = run([1, 2, 5, 6, 1], echo=True, stop=("cx",))

    assert "".join(d.text for d in deltas) == "ab"
    assert entries(deltas) == [(1, 0), (2, 2), (5, 2)]
    assert [t for d in deltas for t in d.token_ids] == [1, 2, 5]


def test_with_echo_a_stop_token_after_held_back_text_lands_after_that_text():
    deltas = run([1, 2, EOS], Finish.STOP_TOKEN, echo=True, stop=("cq",))

    assert "".join(d.text for d in deltas) == "abc"
    assert entries(deltas) == [(1, 0), (2, 2), (EOS, 3)]


@given(
    tokens=st.lists(st.sampled_from(sorted(PIECES)), min_size=1, max_size=8),
    finish=st.sampled_from([Finish.LENGTH, Finish.STOP_TOKEN]),
    stop=st.lists(st.sampled_from(["c", "x", "ab", "€", "!x", "yz", "cx"]), max_size=2),
    include=st.booleans(),
)
def test_with_echo_every_completion_token_has_exactly_one_entry_inside_the_text(
    tokens, finish, stop, include
):
    deltas = run(
        tokens,
        finish,
        echo=True,
        stop=tuple(stop),
        include_stop_str_in_output=include,
        ignore_eos=True,
    )

    text = "".join(d.text for d in deltas)
    kept = [t for d in deltas for t in d.token_ids]
    found = entries(deltas)
    assert [token_id for token_id, _ in found] == kept
    assert all(0 <= offset <= len(text) for _, offset in found)
    assert [offset for _, offset in found] == sorted(offset for _, offset in found)


@pytest.mark.parametrize("payload", [None, (), (position(5), position(5))])
def test_missing_or_inconsistent_payload_fails_the_request(payload):
    record = CompletionRecord(1, 1, Role.SPECULATIVE, (5, 6))

    with pytest.raises(LogprobDataError):
        emission().advance(record, payload)


def test_a_choice_without_logprobs_ignores_any_payload():
    choice = ChoiceEmission(0, SamplingParams(), TableTokenizer())

    delta = choice.advance(sampled(5), None)

    assert delta.text == "x" and delta.logprobs == ()


def test_minus_infinity_goes_on_the_wire_as_minus_9999():
    from domain.emission.outputs import LogprobEntry
    from domain.logprobs.values import LogprobOptions
    from domain.presentation.logprobs import TokenRendering, completion_logprobs

    entry = LogprobEntry(
        PositionLogprobs(TokenLogprob(1, float("-inf")), (TokenLogprob(2, -1.5),)), 0
    )

    wire = completion_logprobs([entry], LogprobOptions(top_k=1), TokenRendering(PIECES.get))

    assert wire["token_logprobs"] == [-9999.0]
    assert wire["top_logprobs"] == [{"ab": -9999.0, "c": -1.5}]


def test_an_included_stop_token_that_completes_a_stop_string_ends_the_choice_there():
    # The stop token's "c" breaks the held euro prefix into U+FFFD, which is the stop string.
    deltas = run(
        [1, 3, 2],
        Finish.STOP_TOKEN,
        stop=("\ufffd",),
        stop_token_ids=(2,),
        include_stop_str_in_output=True,
    )

    assert "".join(d.text for d in deltas) == "ab\ufffd"
    assert deltas[-1].finish_reason == "stop" and deltas[-1].stop_reason == "\ufffd"
    assert entries(deltas) == [(1, 0), (3, 2)]
