"""Tests for stop-string matching with streaming hold-back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain.emission.stops import StopResult, StopStringMatcher


def test_text_without_any_stop_strings_is_released_immediately() -> None:
    matcher = StopStringMatcher(())

    assert matcher.feed("hello") == StopResult("hello", None)
    assert matcher.finish() == ""


def test_stop_inside_one_feed_truncates_the_text_before_it() -> None:
    matcher = StopStringMatcher(("END",))

    assert matcher.feed("abc END def") == StopResult("abc ", "END")
    assert matcher.stop == "END"


def test_stop_inside_one_feed_is_kept_when_asked_to_include_it() -> None:
    matcher = StopStringMatcher(("END",), include_stop_str_in_output=True)

    assert matcher.feed("abc END def") == StopResult("abc END", "END")


def test_stop_spanning_several_feeds_is_found_and_its_start_was_held_back() -> None:
    matcher = StopStringMatcher(("</answer>",))

    assert matcher.feed("42</an") == StopResult("42", None)
    assert matcher.feed("sw") == StopResult("", None)
    assert matcher.feed("er> tail") == StopResult("", "</answer>")


def test_held_text_is_released_once_it_can_no_longer_become_a_stop() -> None:
    matcher = StopStringMatcher(("stop",))

    assert matcher.feed("the st") == StopResult("the ", None)
    assert matcher.feed("ep") == StopResult("step", None)
    assert matcher.finish() == ""


def test_only_the_longest_suffix_that_begins_a_stop_is_held() -> None:
    matcher = StopStringMatcher(("abcdef",))

    # "xyz" can never begin the stop, so it goes out even though the stop is six long.
    assert matcher.feed("xyzab") == StopResult("xyz", None)
    assert matcher.finish() == "ab"


def test_finish_releases_the_held_text() -> None:
    matcher = StopStringMatcher(("###",))

    assert matcher.feed("done ##") == StopResult("done ", None)
    assert matcher.finish() == "##"
    assert matcher.stop is None


def test_include_stop_str_in_output_holds_nothing_back() -> None:
    matcher = StopStringMatcher(("###",), include_stop_str_in_output=True)

    assert matcher.feed("done ##") == StopResult("done ##", None)
    assert matcher.feed("# more") == StopResult("#", "###")


def test_stop_that_completes_first_wins_over_one_that_starts_earlier() -> None:
    matcher = StopStringMatcher(("abcd", "bc"))

    assert matcher.feed("xabcd") == StopResult("xa", "bc")


def test_longest_stop_wins_when_several_complete_at_the_same_character() -> None:
    matcher = StopStringMatcher(("c", "abc", "bc"))

    assert matcher.feed("xabcy") == StopResult("x", "abc")


def test_stop_that_completes_at_the_first_new_character_wins_over_a_later_one() -> None:
    matcher = StopStringMatcher(("zz", "ab"))

    assert matcher.feed("xa") == StopResult("x", None)
    assert matcher.feed("bzz") == StopResult("", "ab")


def test_feed_after_a_stop_is_refused() -> None:
    matcher = StopStringMatcher(("!",))
    matcher.feed("hi!")

    with pytest.raises(RuntimeError):
        matcher.feed("more")
    assert matcher.finish() == ""


def test_feed_after_finish_is_refused() -> None:
    matcher = StopStringMatcher(("!",))
    matcher.finish()

    with pytest.raises(RuntimeError):
        matcher.feed("more")


def test_empty_feed_releases_nothing() -> None:
    matcher = StopStringMatcher(("ab",))
    matcher.feed("a")

    assert matcher.feed("") == StopResult("", None)
    assert matcher.finish() == "a"


def test_a_stop_listed_twice_matches_as_if_listed_once() -> None:
    repeated = StopStringMatcher(("a", "abc", "a", "ab"))
    once = StopStringMatcher(("abc", "ab", "a"))

    for piece in ("xy", "zab"):
        assert repeated.feed(piece) == once.feed(piece)
    assert repeated.stop == once.stop == "a"


def test_construction_rejects_bad_stops() -> None:
    with pytest.raises(ValueError):
        StopStringMatcher(("ok", ""))
    with pytest.raises(TypeError):
        StopStringMatcher(["ok"])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        StopStringMatcher((b"ok",))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        StopStringMatcher(("ok",), include_stop_str_in_output=1)  # type: ignore[arg-type]


def test_stop_result_rejects_non_text_values() -> None:
    with pytest.raises(TypeError):
        StopResult(b"x")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        StopResult("x", 3)  # type: ignore[arg-type]


# --- properties against a one-character-at-a-time reference -----------------------------------


def _reference(text: str, stops: tuple[str, ...], include: bool) -> tuple[str, str | None]:
    """Scan the text a character at a time; the first stop to complete ends it."""
    for end in range(1, len(text) + 1):
        for stop in sorted(stops, key=len, reverse=True):
            if text.endswith(stop, 0, end):
                return text[: end if include else end - len(stop)], stop
    return text, None


def _longest_stop_prefix_suffix(text: str, stops: tuple[str, ...]) -> int:
    return max(
        (size for stop in stops for size in range(1, len(stop)) if text.endswith(stop[:size])),
        default=0,
    )


_alphabet = st.sampled_from("abc")
_stops = st.lists(st.text(_alphabet, min_size=1, max_size=4), max_size=4).map(tuple)


@st.composite
def _text_and_split(draw: st.DrawFn) -> tuple[str, list[str]]:
    text = draw(st.text(_alphabet, max_size=30))
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=10)))
    bounds = [0, *cuts, len(text)]
    return text, [text[start:end] for start, end in zip(bounds, bounds[1:], strict=False)]


@given(_text_and_split(), _stops, st.booleans())
def test_any_split_releases_the_text_up_to_the_first_stop(
    case: tuple[str, list[str]], stops: tuple[str, ...], include: bool
) -> None:
    text, feeds = case
    matcher = StopStringMatcher(stops, include_stop_str_in_output=include)
    limit = max((len(stop) for stop in stops), default=1) - 1
    released = ""
    fed = ""
    stop = None
    for piece in feeds:
        result = matcher.feed(piece)
        fed += piece
        released += result.text
        stop = result.stop
        if stop is not None:
            break
        held = len(fed) - len(released)
        assert held <= (0 if include else limit)
        if not include:
            # Nothing that could still turn into a stop has gone out, and nothing more is held.
            assert held == _longest_stop_prefix_suffix(fed, stops)
    if stop is None:
        released += matcher.finish()

    assert (released, stop) == _reference(text, stops, include)
    assert matcher.stop == stop


@given(st.text(_alphabet, max_size=30), _stops, st.booleans())
def test_feeding_one_character_at_a_time_matches_feeding_everything_at_once(
    text: str, stops: tuple[str, ...], include: bool
) -> None:
    whole = StopStringMatcher(stops, include_stop_str_in_output=include)
    at_once = whole.feed(text)
    at_once_text = at_once.text + (whole.finish() if at_once.stop is None else "")

    single = StopStringMatcher(stops, include_stop_str_in_output=include)
    released = ""
    stop = None
    for char in text:
        result = single.feed(char)
        released += result.text
        stop = result.stop
        if stop is not None:
            break
    if stop is None:
        released += single.finish()

    assert (released, stop) == (at_once_text, at_once.stop)
