"""Logprob entries as the completions and chat wire formats show them (vLLM's shapes)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from domain.common.wire import JsonObject
from domain.emission.detokenizer import decode_whole
from domain.emission.outputs import LogprobEntry
from domain.logprobs.prompt_scores import PromptScore
from domain.logprobs.values import LogprobOptions, wire_logprob, wire_logprobs

if TYPE_CHECKING:  # the domain drives ports but never needs them at run time
    from ports.tokenizer import Tokenizer


@dataclass(frozen=True)
class TokenRendering:
    """How tokens are named on the wire: their bytes decoded, or `token_id:<id>` placeholders.

    Names and byte lists are memoized per token ID for as long as the rendering lives (the
    server keeps one of each kind for its model): a stream with twenty alternatives renders
    the same IDs over and over on the event loop.
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

    def texts(self, token_ids: Sequence[int]) -> list[str]:
        """`text` of each ID, in one pass over the memo."""
        known = self._names.get
        return [n if (n := known(i)) is not None else self.text(i) for i in token_ids]

    def byte_list(self, token_id: int) -> list[int]:
        """The token's raw bytes as JSON integers (a fresh list, safe to hand to a response)."""
        cached = self._byte_lists.get(token_id)
        if cached is None:
            cached = self._byte_lists[token_id] = list(self.token_bytes(token_id))
        return cached.copy()

    def byte_lists(self, token_ids: Sequence[int]) -> list[list[int]]:
        """`byte_list` of each ID, in one pass over the memo."""
        known = self._byte_lists.get
        return [b.copy() if (b := known(i)) is not None else self.byte_list(i) for i in token_ids]


def shown_alternatives(
    entry: LogprobEntry, options: LogprobOptions
) -> tuple[Sequence[int], Sequence[float]]:
    """Selected IDs all, in caller order; otherwise the first `top_k` natural alternatives: their
    IDs and their values."""
    position = entry.position
    if options.selects:
        return position.alternative_ids, position.alternative_logprobs
    count = options.top_k
    return position.alternative_ids[:count], position.alternative_logprobs[:count]


def completion_logprobs(
    entries: Sequence[LogprobEntry],
    options: LogprobOptions,
    rendering: TokenRendering,
    offset_base: int = 0,
) -> JsonObject:
    """`choices[].logprobs` of a completion: parallel lists, `top_logprobs` dicts with the
    chosen token first (its value identical to `token_logprobs`), `text_offset` into `text`."""
    tokens, token_logprobs, top_logprobs, text_offset = [], [], [], []
    for entry in entries:
        chosen = entry.position.chosen
        name = rendering.text(chosen.token_id)
        value = wire_logprob(chosen.logprob)
        top = {name: value}
        ids, values = shown_alternatives(entry, options)
        if ids:
            # Distinct IDs may decode to the same string; the first (the chosen) keeps the key.
            for key, logprob in zip(rendering.texts(ids), wire_logprobs(values), strict=True):
                if key not in top:
                    top[key] = logprob
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


def _chat_token(token_id: int, logprob: float, rendering: TokenRendering) -> JsonObject:
    return {
        "token": rendering.text(token_id),
        "logprob": wire_logprob(logprob),
        "bytes": rendering.byte_list(token_id),
    }


def chat_logprobs(
    entries: Sequence[LogprobEntry], options: LogprobOptions, rendering: TokenRendering
) -> JsonObject:
    """`choices[].logprobs` of a chat completion: one content entry per token, exact raw
    `bytes`, and the true top alternatives in order (or the selected IDs in caller order)."""
    content = []
    for entry in entries:
        chosen = entry.position.chosen
        item = _chat_token(chosen.token_id, chosen.logprob, rendering)
        ids, values = shown_alternatives(entry, options)
        names, byte_lists = rendering.texts(ids), rendering.byte_lists(ids)
        item["top_logprobs"] = [
            {"token": name, "logprob": logprob, "bytes": raw}
            for name, logprob, raw in zip(names, wire_logprobs(values), byte_lists, strict=True)
        ]
        content.append(item)
    return {"content": content}


def prompt_offsets(token_ids: Sequence[int], tokenizer: Tokenizer, text: str) -> list[int]:
    """Character offset of each prompt token in the echoed prompt `text`.

    A token-ID prompt echoes the server decoder's text with special tokens kept; a text prompt
    echoes the request's string, which holds no text for a BOS the tokenizer added, so special
    tokens are skipped when keeping them would not reproduce `text`.
    """
    decoder = decode_whole(tokenizer, token_ids, skip_special_tokens=False)
    if decoder.text != text:
        decoder = decode_whole(tokenizer, token_ids, skip_special_tokens=True)
    return list(decoder.offsets)


def _check_scores(token_ids: Sequence[int], scores: Sequence[PromptScore]) -> None:
    if len(scores) != len(token_ids) - 1:
        raise ValueError(f"{len(scores)} prompt scores for a prompt of {len(token_ids)} tokens")


def echo_logprobs(
    token_ids: Sequence[int],
    scores: Sequence[PromptScore],
    top_k: int,
    rendering: TokenRendering,
    offsets: Sequence[int],
) -> JsonObject:
    """The prompt part of an echoed completion's `logprobs`: position 0 has null logprobs, the
    others the prompt token first and then up to `top_k` alternatives (k or k+1 keys)."""
    _check_scores(token_ids, scores)
    tokens = [rendering.text(token_id) for token_id in token_ids]
    token_logprobs: list[float | None] = [None]
    top_logprobs: list[JsonObject | None] = [None]
    for name, score in zip(tokens[1:], scores, strict=True):
        value = wire_logprob(score.logprob)
        top = {name: value}
        for alternative in score.alternatives[:top_k]:
            top.setdefault(rendering.text(alternative.token_id), wire_logprob(alternative.logprob))
        token_logprobs.append(value)
        top_logprobs.append(top)
    return {
        "text_offset": list(offsets),
        "token_logprobs": token_logprobs,
        "tokens": tokens,
        "top_logprobs": top_logprobs,
    }


def join_completion_logprobs(first: JsonObject, second: JsonObject) -> JsonObject:
    """Two `logprobs` objects of consecutive tokens as one (prompt entries, then generated)."""
    return {key: first[key] + second[key] for key in first}


def vllm_prompt_logprobs(
    token_ids: Sequence[int],
    scores: Sequence[PromptScore],
    top_k: int,
    rendering: TokenRendering,
) -> list[JsonObject | None]:
    """vLLM's `prompt_logprobs`: null for position 0, then per position an object keyed by token ID
    (as a string), the prompt token first, with logprob, rank and decoded_token; then up to
    `top_k` alternatives, whose rank is one plus the number of strictly greater values."""
    _check_scores(token_ids, scores)
    entries: list[JsonObject | None] = [None]
    for token_id, score in zip(token_ids[1:], scores, strict=True):
        entry = {str(token_id): _ranked(token_id, score.logprob, score.rank, rendering)}
        values = [alternative.logprob for alternative in score.alternatives]
        for index, alternative in enumerate(score.alternatives[:top_k]):
            rank = 1 + sum(1 for value in values[:index] if value > values[index])
            entry.setdefault(
                str(alternative.token_id),
                _ranked(alternative.token_id, alternative.logprob, rank, rendering),
            )
        entries.append(entry)
    return entries


def _ranked(token_id: int, logprob: float, rank: int, rendering: TokenRendering) -> JsonObject:
    return {
        "logprob": wire_logprob(logprob),
        "rank": rank,
        "decoded_token": rendering.text(token_id),
    }
