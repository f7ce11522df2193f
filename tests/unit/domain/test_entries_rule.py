"""The one home of the entries rule: which emitted tokens keep entries, and in which part."""

from __future__ import annotations

import pytest

from domain.common.errors import LogprobDataError
from domain.contract.records import CompletionRecord, Role
from domain.emission.entries import Emitted, Part, PartMap, emission_keeps, part_keeps
from domain.emission.entries import record_entries as entries_of
from domain.logprobs.values import PositionLogprobs, TokenLogprob


def position(token_id: int) -> PositionLogprobs:
    return PositionLogprobs(TokenLogprob(token_id, -1.0))


@pytest.mark.parametrize("echo", [False, True])
def test_a_forced_token_never_keeps_its_entry_and_an_ordinary_one_always_does(echo):
    assert not emission_keeps(Emitted.FORCED, echo=echo)
    assert emission_keeps(Emitted.ORDINARY, echo=echo)


@pytest.mark.parametrize("token", [Emitted.STOP, Emitted.PAST_STOP])
def test_a_stop_token_and_a_token_past_a_stop_string_keep_entries_only_under_echo(token):
    assert emission_keeps(token, echo=True)
    assert not emission_keeps(token, echo=False)


def test_only_content_keeps_entries_once_parsed():
    assert [part for part in Part if part_keeps(part)] == [Part.CONTENT]
    assert not part_keeps(None)


def test_a_records_forced_tokens_have_no_entries_whatever_the_echo():
    record = CompletionRecord(0, 0, Role.SAMPLE, (5, 6, 7), forced_mask=0b010)
    payload = [position(5), position(6), position(7)]

    for echo in (False, True):
        assert entries_of(record, payload, echo=echo) == (position(5), None, position(7))


def test_a_record_without_forced_tokens_keeps_every_entry_whatever_the_echo():
    record = CompletionRecord(0, 0, Role.SAMPLE, (5, 6, 7))
    payload = [position(5), position(6), position(7)]

    for echo in (False, True):
        assert entries_of(record, payload, echo=echo) == tuple(payload)


@pytest.mark.parametrize("forced_mask", [0, 0b001])
def test_a_payload_naming_another_token_than_the_record_fails_its_request(forced_mask):
    record = CompletionRecord(3, 0, Role.SAMPLE, (5, 6), forced_mask=forced_mask)

    with pytest.raises(LogprobDataError, match="slot 3: logprob payload names token 9 where"):
        entries_of(record, [position(5), position(9)], echo=False)
    with pytest.raises(LogprobDataError, match="2 emitted tokens"):
        entries_of(record, [position(5)], echo=False)


def test_a_token_takes_the_part_of_its_first_character_and_past_the_text_the_open_part():
    parts = PartMap()
    parts.add(7, Part.DELIMITER)  # <think>
    parts.add(3, Part.REASONING)
    parts.add(2, Part.REASONING)  # however the text arrived, one span
    parts.add(8, Part.DELIMITER)  # </think>
    parts.add(4, Part.CONTENT)

    assert [parts.part_at(offset, tail=None) for offset in (0, 7, 11, 12, 20, 23)] == [
        Part.DELIMITER,
        Part.REASONING,
        Part.REASONING,
        Part.DELIMITER,
        Part.CONTENT,
        Part.CONTENT,
    ]
    assert parts.part_at(24, tail=Part.CONTENT) is Part.CONTENT
    assert parts.content_offset(22) == 2 and parts.content_offset(24) == 4


def test_forgotten_spans_name_no_part():
    parts = PartMap()
    parts.add(2, Part.CONTENT)
    parts.add(2, Part.STRIPPED)
    parts.add(2, Part.CONTENT)
    parts.forget(4)

    assert parts.part_at(1, tail=None) is None
    assert parts.part_at(4, tail=None) is Part.CONTENT
    assert parts.content_offset(5) == 3
