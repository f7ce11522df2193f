"""Stop-string matching over streamed text, holding back what might still become a stop."""

from __future__ import annotations

from dataclasses import dataclass

from domain.common.frozen import quick_init


@quick_init
@dataclass(frozen=True, slots=True)
class StopResult:
    """Text that may be released now, and the stop string that ended the stream, if any."""

    text: str
    stop: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise TypeError("text must be a str")
        if self.stop is not None and not isinstance(self.stop, str):
            raise TypeError("stop must be a str or None")


_NOTHING = StopResult("")


class StopStringMatcher:
    """Finds the first stop string in text fed piece by piece and releases only safe text.

    "First" means the stop that completes at the earliest character of the stream; when
    several complete at the same character (one is a suffix of another) the longest wins,
    since it starts earliest. This depends only on the text, never on how it was split into
    feeds, which a leftmost-start rule could not promise: with stops ``abcd`` and ``bc``,
    ``bc`` completes before ``abcd`` can be seen, so it is the one that stops the stream.

    Without ``include_stop_str_in_output`` the longest unreleased suffix that is a proper
    prefix of some stop is held back (fewer than the longest stop's length). With it nothing
    is held: text that turns out to begin a stop belongs in the output anyway.
    """

    __slots__ = (
        "_stops",
        "_include_stop_str_in_output",
        "_window_size",
        "_hold_limit",
        "_first_chars",
        "_window",
        "_held",
        "_stop",
        "_finished",
    )

    def __init__(self, stops: tuple[str, ...], *, include_stop_str_in_output: bool = False) -> None:
        if not isinstance(stops, tuple):
            raise TypeError("stops must be a tuple of str")
        for stop in stops:
            if not isinstance(stop, str):
                raise TypeError("each stop must be a str")
            if not stop:
                raise ValueError("a stop string must not be empty")
        if not isinstance(include_stop_str_in_output, bool):
            raise TypeError("include_stop_str_in_output must be a bool")
        # Longest first, so the first hit among stops ending at one character is the longest.
        self._stops = tuple(sorted(dict.fromkeys(stops), key=len, reverse=True))
        self._include_stop_str_in_output = include_stop_str_in_output
        # A match completed by new text starts at most this many characters before it.
        self._window_size = len(self._stops[0]) - 1 if self._stops else 0
        self._hold_limit = 0 if include_stop_str_in_output else self._window_size
        self._first_chars = frozenset(stop[0] for stop in self._stops)
        self._window = ""
        self._held = 0
        self._stop: str | None = None
        self._finished = False

    @property
    def stop(self) -> str | None:
        """The stop string that ended the stream, or None."""
        return self._stop

    def feed(self, new_text: str) -> StopResult:
        """Add newly generated text; return what may be released and any stop it completes."""
        if self._stop is not None:
            raise RuntimeError(f"feed after the stream stopped at {self._stop!r}")
        if self._finished:
            raise RuntimeError("feed after finish")
        if not new_text:
            return _NOTHING
        if not self._stops:
            return StopResult(new_text)
        window = self._window
        text = window + new_text
        unreleased_from = len(window) - self._held
        best_end = -1
        best_stop = ""
        for stop in self._stops:
            # Anything ending inside the window was checked by an earlier feed.
            start = text.find(stop, max(0, len(window) - len(stop) + 1))
            if start >= 0:
                end = start + len(stop)
                if best_end < 0 or end < best_end:
                    best_end, best_stop = end, stop
        if best_end >= 0:
            self._stop = best_stop
            self._window = ""
            self._held = 0
            if self._include_stop_str_in_output:
                return StopResult(text[unreleased_from:best_end], best_stop)
            # Released text never ends in a stop prefix, so the match starts in held text.
            return StopResult(text[unreleased_from : best_end - len(best_stop)], best_stop)
        hold = self._hold_length(text, unreleased_from)
        self._held = hold
        size = self._window_size
        self._window = text[max(0, len(text) - size) :] if size else ""
        return StopResult(text[unreleased_from : len(text) - hold])

    def _hold_length(self, text: str, unreleased_from: int) -> int:
        """Length of the longest suffix of unreleased text that some stop begins with."""
        end = len(text)
        first_chars = self._first_chars
        for position in range(max(unreleased_from, end - self._hold_limit), end):
            if text[position] in first_chars:
                tail = text[position:]
                for stop in self._stops:
                    if stop.startswith(tail):
                        return end - position
        return 0

    def finish(self) -> str:
        """End the stream without a stop, releasing whatever was held back."""
        self._finished = True
        if not self._held:
            return ""
        released = self._window[len(self._window) - self._held :]
        self._window = ""
        self._held = 0
        return released
