"""Turns one choice's committed tokens into released text, applying token and string stops."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from domain.detokenizer import IncrementalDetokenizer
from domain.outputs import ChoiceDelta
from domain.records import Finish
from domain.sampling import SamplingParams
from domain.stops import StopResult, StopStringMatcher

if TYPE_CHECKING:  # the domain drives ports but never needs them at run time
    from ports.tokenizer import Tokenizer


class ChoiceText:
    """Text state of one choice: incremental decoder, then stop-string hold-back.

    A terminating stop token (EOS or a `stop_token_ids` entry) stays in `token_ids` but adds text
    only with `include_stop_str_in_output`; a stop string ends the choice at the token whose text
    completes it, and later tokens of that frame are dropped.
    """

    def __init__(self, index: int, params: SamplingParams, tokenizer: Tokenizer) -> None:
        self._index = index
        self._params = params
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
        self.finished = False
        self.num_tokens = 0

    def advance(self, tokens: Sequence[int], finish: Finish) -> ChoiceDelta:
        """Consumes one record's emitted tokens and returns the delta they release."""
        text: list[str] = []
        kept: list[int] = []
        for position, token_id in enumerate(tokens):
            kept.append(token_id)
            is_last = position == len(tokens) - 1
            if is_last and finish is Finish.STOP_TOKEN:
                if self._params.include_stop_str_in_output:
                    text.append(self._feed(self._decoder.push(token_id)).text)
                return self._end(text, kept, "stop", self._stop_reason(token_id))
            result = self._feed(self._decoder.push(token_id))
            text.append(result.text)
            if result.stop is not None:
                return self._end(text, kept, "stop", result.stop, drain=False)
        if finish is Finish.LENGTH:
            return self._end(text, kept, "length", None)
        self.num_tokens += len(kept)
        return ChoiceDelta(self._index, "".join(text), tuple(kept))

    def abort(self, reason: str) -> ChoiceDelta:
        self.finished = True
        return ChoiceDelta(self._index, finish_reason=reason)

    def _feed(self, text: str) -> StopResult:
        return self._matcher.feed(text)

    def _stop_reason(self, token_id: int) -> int | None:
        return (
            None
            if token_id in self._eos and token_id not in self._params.stop_token_ids
            else token_id
        )

    def _end(
        self,
        text: list[str],
        kept: list[int],
        reason: str,
        stop_reason: str | int | None,
        *,
        drain: bool = True,
    ) -> ChoiceDelta:
        if drain:
            tail = self._feed(self._decoder.flush())
            text.append(tail.text)
            if tail.stop is not None:
                reason, stop_reason = "stop", tail.stop
            else:
                text.append(self._matcher.finish())
        self.finished = True
        self.num_tokens += len(kept)
        return ChoiceDelta(self._index, "".join(text), tuple(kept), reason, stop_reason)
