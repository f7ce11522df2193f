"""ABI6 record words: what `encode` writes, `decode` reads back; malformed words are refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain.contract.records import HEADER_WORDS, CompletionRecord, Finish, RecordWord, Role

CAPACITY = 8
_COUNT = st.integers(min_value=0, max_value=2**40)


@st.composite
def records(draw: st.DrawFn) -> CompletionRecord:
    role = draw(st.sampled_from(Role))
    emits = role in (Role.SAMPLE, Role.SPECULATIVE)
    tokens = draw(st.lists(_COUNT, max_size=CAPACITY)) if emits else []
    return CompletionRecord(
        slot=draw(_COUNT),
        epoch=draw(_COUNT),
        role=role,
        tokens=tuple(tokens),
        first_position=draw(_COUNT),
        forced_mask=draw(st.integers(min_value=0, max_value=2**CAPACITY - 1)),
        finish=draw(st.sampled_from(Finish)),
        drafts_offered=draw(_COUNT),
        drafts_accepted=draw(_COUNT),
        generated_total=draw(_COUNT),
    )


@given(records())
def test_a_record_reads_back_as_it_was_written(record):
    words = record.encode(CAPACITY)

    assert len(words) == HEADER_WORDS + CAPACITY
    assert CompletionRecord.decode(words) == record


@given(records())
def test_each_header_field_sits_at_its_named_word_and_unused_words_are_zero(record):
    words = record.encode(CAPACITY)

    assert words[RecordWord.SLOT] == record.slot
    assert words[RecordWord.EPOCH] == record.epoch
    assert words[RecordWord.ROLE] == record.role
    assert words[RecordWord.EMITTED] == len(record.tokens)
    assert words[RecordWord.FIRST_POSITION] == record.first_position
    assert words[RecordWord.FORCED_MASK] == record.forced_mask
    assert words[RecordWord.FINISH] == record.finish
    assert words[RecordWord.DRAFTS_OFFERED] == record.drafts_offered
    assert words[RecordWord.DRAFTS_ACCEPTED] == record.drafts_accepted
    assert words[RecordWord.GENERATED_TOTAL] == record.generated_total
    assert words[len(RecordWord) : HEADER_WORDS] == [0] * (HEADER_WORDS - len(RecordWord))
    assert words[HEADER_WORDS + len(record.tokens) :] == [0] * (CAPACITY - len(record.tokens))


def test_the_token_words_after_the_emitted_ones_are_not_read():
    record = CompletionRecord(slot=1, epoch=2, role=Role.SAMPLE, tokens=(7, 8))
    words = record.encode(CAPACITY)
    words[HEADER_WORDS + 2 :] = [99] * (CAPACITY - 2)

    assert CompletionRecord.decode(words) == record


@pytest.mark.parametrize(
    ("word", "value"),
    [
        (RecordWord.ROLE, 9),
        (RecordWord.ROLE, -1),
        (RecordWord.FINISH, 4),
        (RecordWord.FINISH, -1),
        (RecordWord.EMITTED, -1),
        (RecordWord.EMITTED, CAPACITY + 1),
    ],
)
def test_words_with_an_unknown_role_finish_or_token_count_are_refused(word, value):
    words = CompletionRecord(slot=1, epoch=2, role=Role.SAMPLE, tokens=(7,)).encode(CAPACITY)
    words[word] = value

    with pytest.raises(ValueError):
        CompletionRecord.decode(words)


def test_tokens_beyond_the_capacity_are_refused_when_written():
    record = CompletionRecord(slot=1, epoch=2, role=Role.SAMPLE, tokens=(1,) * (CAPACITY + 1))

    with pytest.raises(ValueError, match="exceed the record capacity"):
        record.encode(CAPACITY)
