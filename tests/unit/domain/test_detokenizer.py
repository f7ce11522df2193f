"""Tests for the incremental detokenizer over token bytes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain.emission.detokenizer import IncrementalDetokenizer

EMOJI = "\U0001f600".encode()  # four bytes: F0 9F 98 80
CJK = "\u4e2d".encode()  # three bytes: E4 B8 AD
CJK_2 = "\u6587".encode()  # three bytes: E6 96 87


def _detokenizer(table: dict[int, bytes], **options: object) -> IncrementalDetokenizer:
    return IncrementalDetokenizer(table.__getitem__, **options)  # type: ignore[arg-type]


def _push_all(detokenizer: IncrementalDetokenizer, token_ids: list[int]) -> list[str]:
    return [detokenizer.push(token_id) for token_id in token_ids]


def test_four_byte_emoji_split_over_four_tokens_is_released_with_its_last_byte() -> None:
    table = {0: b"a", 1: EMOJI[:1], 2: EMOJI[1:2], 3: EMOJI[2:3], 4: EMOJI[3:]}
    detokenizer = _detokenizer(table)

    assert _push_all(detokenizer, [0, 1, 2, 3]) == ["a", "", "", ""]
    assert detokenizer.push(4) == "\U0001f600"
    assert detokenizer.text == "a\U0001f600"
    assert detokenizer.offsets == (0, 1, 1, 1, 1)
    assert detokenizer.flush() == ""


def test_three_byte_cjk_character_split_one_and_two_is_released_once_complete() -> None:
    table = {0: CJK[:1], 1: CJK[1:]}
    detokenizer = _detokenizer(table)

    assert detokenizer.push(0) == ""
    assert detokenizer.push(1) == "\u4e2d"
    assert detokenizer.offsets == (0, 0)
    assert detokenizer.num_tokens == 2


def test_token_that_ends_one_character_and_starts_another_releases_only_the_first() -> None:
    table = {0: CJK[:1], 1: CJK[1:] + CJK_2[:1], 2: CJK_2[1:], 3: b"!"}
    detokenizer = _detokenizer(table)

    assert _push_all(detokenizer, [0, 1, 2, 3]) == ["", "\u4e2d", "\u6587", "!"]
    assert detokenizer.text == "\u4e2d\u6587!"
    assert detokenizer.offsets == (0, 0, 1, 2)


def test_invalid_byte_becomes_one_replacement_character_in_place() -> None:
    table = {0: b"a\xffb", 1: b"\xff", 2: b"c"}
    detokenizer = _detokenizer(table)

    assert _push_all(detokenizer, [0, 1, 2]) == ["a\ufffdb", "\ufffd", "c"]
    assert detokenizer.offsets == (0, 3, 4)


def test_held_prefix_broken_by_a_byte_that_cannot_continue_it_is_flushed_as_replacement() -> None:
    table = {0: b"x", 1: CJK[:2], 2: b"y"}
    detokenizer = _detokenizer(table)

    assert _push_all(detokenizer, [0, 1, 2]) == ["x", "", "\ufffdy"]
    # "y" lands after the replacement that stands for the broken prefix.
    assert detokenizer.offsets == (0, 1, 2)


def test_held_prefix_broken_by_an_invalid_byte_renders_like_a_whole_string_decode() -> None:
    table = {0: CJK[:2], 1: b"\xff"}
    detokenizer = _detokenizer(table)

    assert "".join(_push_all(detokenizer, [0, 1])) == (CJK[:2] + b"\xff").decode(
        "utf-8", errors="replace"
    )
    assert detokenizer.text == "\ufffd\ufffd"


# Overlong forms, surrogates and code points past U+10FFFF are ruled out by the second byte.
@pytest.mark.parametrize(
    ("lead", "second"), [(0xE0, 0x9F), (0xED, 0xA0), (0xF0, 0x8F), (0xF4, 0x90), (0xC2, 0x41)]
)
def test_second_byte_outside_the_range_of_its_lead_breaks_the_held_prefix(
    lead: int, second: int
) -> None:
    detokenizer = _detokenizer({0: bytes([lead]), 1: bytes([second])})

    released = "".join(_push_all(detokenizer, [0, 1])) + detokenizer.flush()
    assert released == bytes([lead, second]).decode("utf-8", errors="replace")
    assert detokenizer.offsets == (0, 1)


def test_surrogate_half_is_rendered_at_once_instead_of_waiting_for_more_bytes() -> None:
    # ED A0 can only begin a UTF-16 surrogate, never valid UTF-8, whatever follows.
    detokenizer = _detokenizer({0: b"\xed", 1: b"\xa0", 2: b""})

    assert _push_all(detokenizer, [0, 1, 2]) == ["", "\ufffd\ufffd", ""]
    assert detokenizer.flush() == ""  # nothing was left held
    assert detokenizer.offsets == (0, 1, 2)


@pytest.mark.parametrize(
    ("lead", "second"), [(0xE0, 0xA0), (0xED, 0x9F), (0xF0, 0x90), (0xF4, 0x8F), (0xC2, 0x80)]
)
def test_second_byte_inside_the_range_of_its_lead_continues_the_held_prefix(
    lead: int, second: int
) -> None:
    detokenizer = _detokenizer({0: bytes([lead]), 1: bytes([second])})

    _push_all(detokenizer, [0, 1])
    assert detokenizer.offsets == (0, 0)


def test_flush_releases_an_incomplete_character_as_one_replacement() -> None:
    table = {0: b"ok", 1: EMOJI[:2]}
    detokenizer = _detokenizer(table)

    assert _push_all(detokenizer, [0, 1]) == ["ok", ""]
    assert detokenizer.flush() == "\ufffd"
    assert detokenizer.text == "ok\ufffd"
    assert detokenizer.flush() == ""


def test_push_after_flush_is_refused() -> None:
    detokenizer = _detokenizer({0: b"a"})
    detokenizer.flush()

    with pytest.raises(RuntimeError):
        detokenizer.push(0)


def test_skipped_special_token_adds_no_text_but_counts_as_a_token() -> None:
    table = {0: b"<s>", 1: b"hi", 2: b"</s>"}
    detokenizer = _detokenizer(table, special_token_ids=frozenset({0, 2}))

    assert _push_all(detokenizer, [0, 1, 2]) == ["", "hi", ""]
    assert detokenizer.num_tokens == 3
    assert detokenizer.offsets == (0, 0, 2)


def test_special_token_text_is_kept_when_skipping_is_off() -> None:
    table = {0: b"<s>", 1: b"hi"}
    detokenizer = _detokenizer(table, special_token_ids=frozenset({0}), skip_special_tokens=False)

    assert _push_all(detokenizer, [0, 1]) == ["<s>", "hi"]
    assert detokenizer.offsets == (0, 3)


def test_skipped_special_token_inside_a_split_character_lets_it_join_up() -> None:
    table = {0: CJK[:1], 1: b"<pad>", 2: CJK[1:]}
    detokenizer = _detokenizer(table, special_token_ids=frozenset({1}))

    assert _push_all(detokenizer, [0, 1, 2]) == ["", "", "\u4e2d"]
    assert detokenizer.offsets == (0, 0, 0)


def test_leading_space_is_stripped_only_at_the_start_of_the_sequence() -> None:
    table = {0: b" Hello", 1: b" world"}
    detokenizer = _detokenizer(table, strip_leading_space=True)

    assert _push_all(detokenizer, [0, 1]) == ["Hello", " world"]
    assert detokenizer.text == "Hello world"
    assert detokenizer.offsets == (0, 5)


def test_leading_space_is_kept_when_stripping_is_off() -> None:
    detokenizer = _detokenizer({0: b" Hello"})

    assert detokenizer.push(0) == " Hello"


def test_leading_space_alone_in_the_first_token_is_stripped_and_only_once() -> None:
    table = {0: b"<s>", 1: b" ", 2: b" x"}
    detokenizer = _detokenizer(table, special_token_ids=frozenset({0}), strip_leading_space=True)

    assert _push_all(detokenizer, [0, 1, 2]) == ["", "", " x"]
    assert detokenizer.text == " x"
    assert detokenizer.offsets == (0, 0, 0)


def test_leading_space_after_an_unskipped_special_token_is_not_stripped() -> None:
    table = {0: b"<s>", 1: b" x"}
    detokenizer = _detokenizer(
        table,
        special_token_ids=frozenset({0}),
        skip_special_tokens=False,
        strip_leading_space=True,
    )

    assert detokenizer.text == ""
    assert _push_all(detokenizer, [0, 1]) == ["<s>", " x"]


def test_empty_piece_points_at_the_end_of_released_text() -> None:
    table = {0: b"ab", 1: b"", 2: EMOJI[:1], 3: b"", 4: EMOJI[1:]}
    detokenizer = _detokenizer(table)

    _push_all(detokenizer, [0, 1, 2, 3, 4])
    assert detokenizer.offsets == (0, 2, 2, 2, 2)
    assert detokenizer.offset(4) == 2


def test_a_token_with_no_bytes_lands_where_the_next_byte_does() -> None:
    # 0: a held prefix, 1: a skipped special token, 2: a byte that breaks the prefix.
    table = {0: CJK[:2], 1: b"<s>", 2: b"y", 3: b"\xc3"}
    broken = _detokenizer(table, special_token_ids=frozenset({1}))
    _push_all(broken, [0, 1, 2])
    assert broken.text == "\ufffdy"
    # The special token sits before "y", after the replacement its neighbour's bytes make.
    assert broken.offsets == (0, 1, 1)

    continued = _detokenizer({0: CJK[:1], 1: b"<s>", 2: CJK[1:]}, special_token_ids=frozenset({1}))
    _push_all(continued, [0, 1, 2])
    assert continued.offsets == (0, 0, 0)

    flushed = _detokenizer(table, special_token_ids=frozenset({1}))
    _push_all(flushed, [3, 1])
    assert flushed.settled == 1
    flushed.flush()
    assert flushed.text == "\ufffd"
    assert flushed.offsets == (0, 1)
    assert flushed.settled == 2


def test_construction_rejects_bad_options() -> None:
    with pytest.raises(TypeError):
        IncrementalDetokenizer(b"ab")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        IncrementalDetokenizer(bytes, special_token_ids={1})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        IncrementalDetokenizer(bytes, skip_special_tokens=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        IncrementalDetokenizer(bytes, strip_leading_space="yes")  # type: ignore[arg-type]


# --- properties against whole-string decoding -------------------------------------------------


def _char_index(data: bytes, position: int) -> int:
    """Index, in the whole decode of ``data``, of the character holding byte ``position``.

    A cut at a character boundary decodes into two halves whose lengths add up to the whole;
    a cut inside one renders that character as extra replacements, so it adds up to more.
    """
    before = len(data[:position].decode("utf-8", errors="replace"))
    after = len(data[position:].decode("utf-8", errors="replace"))
    whole = len(data.decode("utf-8", errors="replace"))
    return before if before + after == whole else before - 1


def _check_against_whole_decode(
    pieces: list[bytes],
    special: frozenset[int],
    token_ids: list[int],
    skip_special_tokens: bool,
    strip_leading_space: bool,
) -> None:
    detokenizer = IncrementalDetokenizer(
        pieces.__getitem__,
        special_token_ids=special,
        skip_special_tokens=skip_special_tokens,
        strip_leading_space=strip_leading_space,
    )
    released = [detokenizer.push(token_id) for token_id in token_ids]
    released.append(detokenizer.flush())

    kept = [
        pieces[token_id]
        for token_id in token_ids
        if not (skip_special_tokens and token_id in special)
    ]
    data = b"".join(kept)
    expected = data.decode("utf-8", errors="replace")
    stripped = strip_leading_space and expected.startswith(" ")
    if stripped:
        expected = expected[1:]
    assert "".join(released) == expected
    assert detokenizer.text == expected
    assert detokenizer.num_tokens == len(token_ids)

    offsets = detokenizer.offsets
    assert list(offsets) == sorted(offsets)
    assert all(0 <= offset <= len(expected) for offset in offsets)
    position = 0
    for index, token_id in enumerate(token_ids):
        skipped = skip_special_tokens and token_id in special
        piece = b"" if skipped else pieces[token_id]
        # A piece lands where its first byte does; an empty one where the next byte does.
        wanted = _char_index(data, position)
        if stripped:
            wanted = max(0, wanted - 1)
        assert offsets[index] == wanted, (index, token_id)
        position += len(piece)


# Fragments of real characters make split and broken sequences common, which random bytes
# alone would rarely produce.
_fragment = st.tuples(st.characters(codec="utf-8"), st.integers(0, 3), st.integers(0, 4)).map(
    lambda t: t[0].encode()[t[1] : t[1] + t[2]]
)
_piece = st.one_of(
    _fragment,
    st.binary(max_size=4),
    st.text(max_size=3).map(lambda text: text.encode()),
    st.sampled_from([b" ", b" a", b"\xff", b"\xc0", b"\xe0", b"\xed", b"\xf0", b"\xf4"]),
    # Continuation bytes at the edges of the narrow second-byte ranges.
    st.sampled_from([b"\x80", b"\x8f", b"\x90", b"\x9f", b"\xa0", b"\xbf"]),
)


@st.composite
def _vocab_and_sequence(draw: st.DrawFn) -> tuple[list[bytes], frozenset[int], list[int]]:
    pieces = draw(st.lists(_piece, min_size=1, max_size=16))
    ids = st.integers(0, len(pieces) - 1)
    special = frozenset(draw(st.lists(ids, max_size=3)))
    token_ids = draw(st.lists(ids, max_size=40))
    return pieces, special, token_ids


@given(_vocab_and_sequence(), st.booleans(), st.booleans())
def test_random_vocabulary_and_sequence_match_whole_string_decoding(
    case: tuple[list[bytes], frozenset[int], list[int]],
    skip_special_tokens: bool,
    strip_leading_space: bool,
) -> None:
    pieces, special, token_ids = case
    _check_against_whole_decode(
        pieces, special, token_ids, skip_special_tokens, strip_leading_space
    )


@st.composite
def _text_cut_into_tokens(draw: st.DrawFn) -> list[bytes]:
    data = draw(st.text(min_size=1, max_size=20).map(lambda text: text.encode()))
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=12)))
    bounds = [0, *cuts, len(data)]
    return [data[start:end] for start, end in zip(bounds, bounds[1:], strict=False)]


@given(_text_cut_into_tokens(), st.booleans())
def test_valid_text_cut_at_arbitrary_bytes_comes_back_unchanged(
    pieces: list[bytes], strip_leading_space: bool
) -> None:
    _check_against_whole_decode(
        pieces, frozenset(), list(range(len(pieces))), True, strip_leading_space
    )
