"""A choice's emission state machine: records in, released text, offsets and entries out."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from domain.common.errors import LogprobDataError
from domain.contract.records import CompletionRecord, Finish
from domain.emission.detokenizer import IncrementalDetokenizer
from domain.emission.entries import Emitted, emission_keeps, record_entries
from domain.emission.outputs import ChoiceDelta, LogprobEntry
from domain.emission.stops import StopStringMatcher
from domain.logprobs.values import PositionLogprobs
from domain.requests.sampling import SamplingParams

if TYPE_CHECKING:  # the domain drives ports but never needs them at run time
    from ports.tokenizer import Tokenizer


class ChoiceEmission:
    """The emission state machine of one choice: records in, released text and entries out.

    Each record's emitted tokens pass through the incremental decoder, then the stop-string
    hold-back. Which tokens keep entries is `domain.emission.entries`'s rule; here each token
    is told what it is (`Emitted`), and its entry is placed:
    - A requesting choice's payload has one position per emitted token, naming that token
      (`LogprobDataError` otherwise); a forced token (the record's forced mask) has no entry.
    - A terminating stop token (EOS or a `stop_token_ids` entry) stays in `token_ids` but adds
      text only with `include_stop_str_in_output`, and has no entry; an EOS under `ignore_eos`
      is an ordinary token and keeps its entry in order.
    - A stop string ends the choice at the token whose text completes it; later tokens of the
      record are dropped, and only tokens whose text starts before the stop keep entries.
    - With `echo` every kept token that is not forced has an entry, the terminating stop token
      and the tokens at or after a stop string included, at an offset no later than the end of
      the text: echo arrays are indexed by position (prompt entries, then completion tokens).
    - Entries are released with their token's first character (text held back while a stop may
      be forming holds its entries too), so streamed entries concatenate to the whole result.
    - Offsets follow contracts/api.md, "Text offsets": the character of the final text that
      holds the token's first byte (a token with no bytes: the next byte's), never past the end
      of the text. They are read from the decoder when released, once it has settled them.
    """

    def __init__(
        self,
        index: int,
        params: SamplingParams,
        tokenizer: Tokenizer,
        *,
        logprobs: bool = False,
        echo: bool = False,
    ) -> None:
        self._index = index
        self._params = params
        self._logprobs = logprobs
        self._echo = echo
        self._eos = tokenizer.eos_token_ids
        self._decoder = IncrementalDetokenizer(
            tokenizer.token_bytes,
            special_token_ids=tokenizer.special_token_ids,
            skip_special_tokens=params.skip_special_tokens,
            strip_leading_space=tokenizer.strips_leading_space,
        )
        self._matcher = StopStringMatcher(
            params.stop, include_stop_str_in_output=params.include_stop_str_in_output
        )
        self._released = 0
        # Entries waiting for their text: (the token's index in the decoder, its logprobs). The
        # offset is read when the entry is released, once the decoder has settled it.
        self._pending: deque[tuple[int, PositionLogprobs]] = deque()
        # Decoder tokens whose text offsets have been handed out in `text_offsets`.
        self._offsets_sent = 0
        # The text offsets handed out by the record being consumed.
        self._offsets: list[int] = []
        self.finished = False
        self.num_tokens = 0

    def advance(
        self, record: CompletionRecord, payload: Sequence[PositionLogprobs] | None = None
    ) -> ChoiceDelta:
        """Consumes one record's emitted tokens and returns the delta they release.

        `payload` is the lane's decoded positions; only a choice that requested logprobs reads
        it, and for such a choice a record that emits must carry one.
        """
        positions = None
        if self._logprobs and record.emits:
            if payload is None:
                raise LogprobDataError(
                    f"slot {record.slot}: logprobs were requested but the frame carries none"
                )
            positions = record_entries(record, payload, echo=self._echo)
        return self._advance(record.tokens, record.finish, positions)

    def end(self) -> ChoiceDelta:
        """Ends a choice that has nothing (more) to emit, such as a prompt-only echo."""
        return self._advance((), Finish.LENGTH, None)

    def abort(self, reason: str) -> ChoiceDelta:
        self.finished = True
        return ChoiceDelta(self._index, finish_reason=reason)

    def _advance(
        self,
        tokens: Sequence[int],
        finish: Finish,
        positions: Sequence[PositionLogprobs | None] | None,
    ) -> ChoiceDelta:
        text: list[str] = []
        kept: list[int] = []
        self._offsets = []
        for index, token_id in enumerate(tokens):
            kept.append(token_id)
            position = positions[index] if positions is not None else None
            if index == len(tokens) - 1 and finish is Finish.STOP_TOKEN:
                entry = position if emission_keeps(Emitted.STOP, echo=self._echo) else None
                pushed = self._params.include_stop_str_in_output
                if pushed:
                    text.append(self._push(token_id, entry))
                    entry = None
                    if self._matcher.stop is not None:
                        # Its text (or the U+FFFD it turns held bytes into) completed a stop.
                        return self._end(text, kept, "stop", self._matcher.stop, drain=False)
                return self._end(
                    text,
                    kept,
                    "stop",
                    self._stop_reason(token_id),
                    last=entry,
                    textless=not pushed,
                )
            text.append(self._push(token_id, position))
            if self._matcher.stop is not None:
                return self._end(text, kept, "stop", self._matcher.stop, drain=False)
        if finish is Finish.LENGTH:
            return self._end(text, kept, "length", None)
        self.num_tokens += len(kept)
        entries = self._release()
        self._send_offsets()
        return ChoiceDelta(
            self._index,
            "".join(text),
            tuple(kept),
            logprobs=entries,
            text_offsets=tuple(self._offsets),
        )

    def _push(self, token_id: int, position: PositionLogprobs | None) -> str:
        """Decodes one token (queueing its entry) and passes its text through the stops."""
        new_text = self._decoder.push(token_id)
        if position is not None:
            self._pending.append((self._decoder.num_tokens - 1, position))
        return self._feed(new_text)

    def _send_offsets(self, *, final: bool = False) -> None:
        """Hands out, in order, the text offsets of the decoder's tokens whose first character
        is released, as their entries are; a token with no bytes waits until the byte after it
        settles where it lands. At the end the rest follow, none past the end of the text."""
        decoder = self._decoder
        upto = decoder.num_tokens if final else decoder.settled
        while self._offsets_sent < upto:
            offset = decoder.offset(self._offsets_sent)
            if not final and offset >= self._released:
                break
            self._offsets.append(min(offset, self._released))
            self._offsets_sent += 1

    def _feed(self, new_text: str) -> str:
        """Passes decoded text through the stops; returns what they release (all of it for a
        choice without stop strings, whose matcher would hold nothing back)."""
        released = self._matcher.feed(new_text).text if self._params.stop else new_text
        self._released += len(released)
        return released

    def _release(self, *, everything: bool = False) -> tuple[LogprobEntry, ...]:
        """Entries whose token's first byte lands in released text (a provisional offset
        points at a held character, never released text)."""
        entries = []
        offset = self._decoder.offset
        while self._pending and (everything or offset(self._pending[0][0]) < self._released):
            index, position = self._pending.popleft()
            entries.append(LogprobEntry(position, offset(index)))
        return tuple(entries)

    def _stop_reason(self, token_id: int) -> int | None:
        eos_only = token_id in self._eos and token_id not in self._params.stop_token_ids
        return None if eos_only else token_id

    def _end(
        self,
        text: list[str],
        kept: list[int],
        reason: str,
        stop_reason: str | int | None,
        *,
        drain: bool = True,
        last: PositionLogprobs | None = None,
        textless: bool = False,
    ) -> ChoiceDelta:
        """Ends the choice; `last` is an echoed stop token's entry, placed at the text's end,
        and `textless` says the last kept token (a stop token) added no text: its offset is
        the text's end too."""
        if drain:
            text.append(self._feed(self._decoder.flush()))
            if self._matcher.stop is not None:
                reason, stop_reason = "stop", self._matcher.stop
            else:
                tail = self._matcher.finish()
                self._released += len(tail)
                text.append(tail)
        self._send_offsets(final=True)
        if textless:
            self._offsets.append(self._released)
        # Tokens not yet released start past a stop string's start, or have no text of their
        # own at the end of the text.
        rest = Emitted.PAST_STOP if self._matcher.stop is not None else Emitted.ORDINARY
        entries = self._release(everything=emission_keeps(rest, echo=self._echo))
        if last is not None:
            entries += (LogprobEntry(last, self._released),)
        if self._echo:
            entries = tuple(_at_most(entry, self._released) for entry in entries)
        self._pending.clear()
        self.finished = True
        self.num_tokens += len(kept)
        return ChoiceDelta(
            self._index,
            "".join(text),
            tuple(kept),
            reason,
            stop_reason,
            entries,
            tuple(self._offsets),
        )


def _at_most(entry: LogprobEntry, end: int) -> LogprobEntry:
    """The entry with its offset clamped to `end`: a token after a stop string's start has no
    text of its own, so it points at the end of the text."""
    if entry.text_offset <= end:
        return entry
    return LogprobEntry(entry.position, end)
