"""The body of `POST /v1/completions`: text or token-ID prompts, batches, echo."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from msgspec import Meta

from adapters.http.requests.declared import CompletionMaxTokens, Flag, Integer, whole_or_none
from adapters.http.requests.decoding import decode, is_text
from adapters.http.requests.shared import GenerationBody, api_request, logprob_ask
from domain.common.errors import InvalidRequestError
from domain.common.ranges import check_token_ids
from domain.emission.detokenizer import decode_whole
from domain.requests.api_request import ApiRequest, Prompt
from domain.structured.rules import StructuredAsk
from ports.tokenizer import Tokenizer

# Token IDs may be spelled as integral floats, as every declared integer may.
PromptValue = Annotated[
    str | list[str | int | float | list[int | float]],
    Meta(
        description="a non-empty string, a list of strings, a list of token IDs or a list of "
        "token ID lists"
    ),
]


class CompletionBody(GenerationBody, frozen=True):
    prompt: PromptValue | None = None
    max_tokens: CompletionMaxTokens | None = None
    logprobs: Integer | None = None
    echo: Flag | None = None


def completion_request(raw: bytes, tokenizer: Tokenizer) -> ApiRequest:
    body = decode(raw, CompletionBody)
    max_tokens = 16 if body.max_tokens is None else whole_or_none(body.max_tokens)
    count = whole_or_none(body.logprobs)
    ask = logprob_ask(
        body, wanted=count is not None, count=count, count_param="logprobs", echo=bool(body.echo)
    )
    prompts = _prompts(body.prompt, tokenizer)
    structured = StructuredAsk(
        response_format=body.response_format, structured_outputs=body.structured_outputs
    )
    return api_request(body, prompts, max_tokens, ask, structured)


def _prompts(raw: PromptValue | None, tokenizer: Tokenizer) -> tuple[Prompt, ...]:
    if isinstance(raw, str):
        return (_text_prompt(raw, tokenizer),)
    if isinstance(raw, list) and raw:
        token_ids = _token_ids(raw)
        if token_ids is not None:
            return (_token_prompt(token_ids, tokenizer),)
        if all(isinstance(item, str) for item in raw):
            return tuple(_text_prompt(item, tokenizer) for item in raw)  # type: ignore[arg-type]
        batch = [_token_ids(item) if isinstance(item, list) else None for item in raw]
        lists = [token_ids for token_ids in batch if token_ids]
        if len(lists) == len(batch):  # every item is a non-empty list of token IDs
            return tuple(_token_prompt(token_ids, tokenizer) for token_ids in lists)
    raise InvalidRequestError(
        "`prompt` must be a non-empty string, a list of strings, a list of token IDs or a list "
        "of token ID lists",
        param="prompt",
    )


def _token_ids(items: Sequence[object]) -> list[int] | None:
    """The token IDs of a list of integers (integral floats count), or None."""
    numbers = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            return None
        if isinstance(item, float) and not item.is_integer():
            return None
        numbers.append(int(item))
    return numbers


def _text_prompt(text: str, tokenizer: Tokenizer) -> Prompt:
    if not text:
        raise InvalidRequestError("the prompt must not be empty", param="prompt")
    if not is_text(text):
        raise InvalidRequestError("the prompt must be valid Unicode", param="prompt")
    return Prompt(tuple(tokenizer.encode(text)), text)


def _token_prompt(token_ids: list[int], tokenizer: Tokenizer) -> Prompt:
    check_token_ids(token_ids, tokenizer.vocab_size, "prompt")
    # Echoed as the server's decoder shows text (contracts/api.md, "Text offsets"): a
    # byte-fallback decoder would turn a run of byte pieces holding any invalid byte into one
    # U+FFFD per byte, valid characters included, which the echoed offsets cannot index.
    text = decode_whole(tokenizer, token_ids, skip_special_tokens=False).text
    return Prompt(tuple(token_ids), text)
