"""Logprob entries as the completions and chat wire formats show them (vLLM's shapes)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from domain.logprobs import LogprobOptions, TokenLogprob, wire_logprob
from domain.outputs import LogprobEntry


@dataclass(frozen=True)
class TokenRendering:
    """How tokens are named on the wire: their bytes decoded, or `token_id:<id>` placeholders.

    Names and byte lists are memoized per request: a stream with twenty alternatives renders the
    same few hundred IDs over and over on the event loop.
    """

    token_bytes: Callable[[int], bytes]
    as_token_ids: bool = False
    _names: dict[int, str] = field(default_factory=dict, compare=False, repr=False)
    _byte_lists: dict[int, list[int]] = field(default_factory=dict, compare=False, repr=False)

    def text(self, token_id: int) -> str:
        name = self._names.get(token_id)
        if name is None:
            if self.as_token_ids:
                name = f"token_id:{token_id}"
            else:
                name = self.token_bytes(token_id).decode("utf-8", errors="replace")
            self._names[token_id] = name
        return name

    def byte_list(self, token_id: int) -> list[int]:
        """The token's raw bytes as JSON integers (a fresh list, safe to hand to a response)."""
        cached = self._byte_lists.get(token_id)
        if cached is None:
            cached = self._byte_lists[token_id] = list(self.token_bytes(token_id))
        return cached.copy()


def _alternatives(entry: LogprobEntry, options: LogprobOptions) -> tuple[TokenLogprob, ...]:
    """Selected IDs all, in caller order; otherwise the first `top_k` natural alternatives."""
    alternatives = entry.position.alternatives
    return alternatives if options.selects else alternatives[: options.top_k]


def completion_logprobs(
    entries: Sequence[LogprobEntry],
    options: LogprobOptions,
    rendering: TokenRendering,
    offset_base: int = 0,
) -> dict:
    """`choices[].logprobs` of a completion: parallel lists, `top_logprobs` dicts with the
    chosen token first (its value identical to `token_logprobs`), `text_offset` into `text`."""
    tokens, token_logprobs, top_logprobs, text_offset = [], [], [], []
    for entry in entries:
        chosen = entry.position.chosen
        name = rendering.text(chosen.token_id)
        value = wire_logprob(chosen.logprob)
        top = {name: value}
        for alternative in _alternatives(entry, options):
            # Distinct IDs may decode to the same string; the first (the chosen) keeps the key.
            top.setdefault(rendering.text(alternative.token_id), wire_logprob(alternative.logprob))
        tokens.append(name)
        token_logprobs.append(value)
        top_logprobs.append(top)
        text_offset.append(offset_base + entry.text_offset)
    return {
        "text_offset": text_offset,
        "token_logprobs": token_logprobs,
        "tokens": tokens,
        "top_logprobs": top_logprobs,
    }


def _chat_token(token: TokenLogprob, rendering: TokenRendering) -> dict:
    return {
        "token": rendering.text(token.token_id),
        "logprob": wire_logprob(token.logprob),
        "bytes": rendering.byte_list(token.token_id),
    }


def chat_logprobs(
    entries: Sequence[LogprobEntry], options: LogprobOptions, rendering: TokenRendering
) -> dict:
    """`choices[].logprobs` of a chat completion: one content entry per token, exact raw
    `bytes`, and the true top alternatives in order (or the selected IDs in caller order)."""
    content = []
    for entry in entries:
        item = _chat_token(entry.position.chosen, rendering)
        item["top_logprobs"] = [_chat_token(a, rendering) for a in _alternatives(entry, options)]
        content.append(item)
    return {"content": content}
