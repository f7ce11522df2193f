"""The bodies of `POST /tokenize` (a prompt, or chat messages) and `POST /detokenize`."""

from __future__ import annotations

from typing import Any

from msgspec import structs

from adapters.http.requests.chat import ChatBody, chat_api_request
from adapters.http.requests.declared import Body, Flag, Text, TokenIds, whole
from adapters.http.requests.decoding import decode
from domain.common.errors import InvalidRequestError
from domain.common.ranges import check_token_ids
from ports.tokenizer import Tokenizer


class TokenizeBody(Body, frozen=True):
    """What `/tokenize` reads of a prompt body; a body with `messages` is read again as chat's.

    Like vLLM, a prompt body's other fields are ignored, and so is a chat body's budget.
    """

    prompt: Text | None = None
    add_special_tokens: Flag | None = None
    model: Text | None = None
    messages: Any = None


class ChatTokenizeBody(ChatBody, frozen=True):
    """A chat body whose output budget is ignored: `/tokenize` only renders its prompt."""

    max_tokens: Any = None
    max_completion_tokens: Any = None


class DetokenizeBody(Body, frozen=True):
    tokens: TokenIds | None = None
    model: Text | None = None


def tokenize_request(raw: bytes, tokenizer: Tokenizer) -> tuple[list[int], str | None]:
    """The prompt's token IDs and the model the body names."""
    body = decode(raw, TokenizeBody)
    if body.messages is not None:
        chat = decode(raw, ChatTokenizeBody)
        budget = structs.replace(chat, max_tokens=None, max_completion_tokens=1)
        return list(chat_api_request(budget, tokenizer).prompts[0].token_ids), chat.model
    if body.prompt is None:
        raise InvalidRequestError("`prompt` or `messages` is required", param="prompt")
    add_special = body.add_special_tokens is not False
    return tokenizer.encode(body.prompt, add_special_tokens=add_special), body.model


def detokenize_request(raw: bytes, vocab_size: int) -> tuple[list[int], str | None]:
    """The token IDs to decode and the model the body names."""
    body = decode(raw, DetokenizeBody)
    if body.tokens is None:
        raise InvalidRequestError("`tokens` is required", param="tokens")
    tokens = [whole(token) for token in body.tokens]
    check_token_ids(tokens, vocab_size, "tokens")
    return tokens, body.model
