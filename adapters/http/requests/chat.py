"""The body of `POST /v1/chat/completions`: messages through the model's chat template."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from adapters.http.requests.declared import Flag, Integer, Objects, TokenBudget, whole_or_none
from adapters.http.requests.decoding import decode, is_text
from adapters.http.requests.shared import GenerationBody, api_request, logprob_ask
from domain.common.errors import InvalidRequestError
from domain.requests.api_request import ApiRequest, Prompt
from domain.structured.rules import StructuredAsk
from ports.tokenizer import Tokenizer

_ROLES = ("system", "user", "assistant", "developer", "tool")
Role = Annotated[
    Literal["system", "user", "assistant", "developer", "tool"],
    Meta(description=f"one of {', '.join(_ROLES)}"),
]


class TextPart(Struct, frozen=True):
    type: Annotated[
        Literal["text"], Meta(description="'text' (other content parts are not served)")
    ]
    text: Annotated[str, Meta(description="a string of valid Unicode")]


Content = Annotated[
    str | list[TextPart], Meta(description="a string of valid Unicode or a list of text parts")
]
ToolCalls = Annotated[
    list[dict[str, Any]], Meta(min_length=1, description="a non-empty list of objects")
]


class Message(Struct, kw_only=True, frozen=True):
    """A message as the chat template sees it: role and text content.

    As in OpenAI's API, only an assistant message that carries `tool_calls` may leave
    `content` out or null. The template sees such a message with empty content, never its
    calls.
    """

    role: Role
    content: Content | None = None
    tool_calls: ToolCalls | None = None

    def for_template(self) -> dict[str, str]:
        """Checked after the whole body decoded, as the logprob fields' 400s come first."""
        content = self.content
        if content is None and not (self.role == "assistant" and self.tool_calls):
            raise InvalidRequestError(
                f"a {self.role} message needs `content`; only an assistant message with "
                "`tool_calls` may leave it out",
                param="messages",
            )
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        else:
            text = "".join(part.text for part in content)
        if not is_text(text):
            raise InvalidRequestError("message content must be valid Unicode", param="messages")
        return {"role": self.role, "content": text}


class ChatFields(GenerationBody, frozen=True):
    """Everything of a chat body but its messages (`/tokenize` takes them too)."""

    logprobs: Flag | None = None
    top_logprobs: Integer | None = None
    max_tokens: TokenBudget | None = None
    max_completion_tokens: TokenBudget | None = None
    add_generation_prompt: Flag | None = None
    tools: Objects | None = None
    tool_choice: (
        Annotated[str | dict[str, Any], Meta(description="a string or an object")] | None
    ) = None
    parallel_tool_calls: Flag | None = None


class ChatBody(ChatFields, kw_only=True, frozen=True):
    messages: Annotated[list[Message], Meta(min_length=1, description="a non-empty list")]


def chat_request(raw: bytes, tokenizer: Tokenizer, *, auto_tool_choice: bool = False) -> ApiRequest:
    """`auto_tool_choice`: the server parses tool calls (`--enable-auto-tool-choice`)."""
    return chat_api_request(decode(raw, ChatBody), tokenizer, auto_tool_choice=auto_tool_choice)


def chat_api_request(
    body: ChatFields,
    tokenizer: Tokenizer,
    messages: list[Message] | None = None,
    *,
    auto_tool_choice: bool = False,
) -> ApiRequest:
    """The API request of a decoded chat body (`messages`: those of a body that is not one)."""
    if messages is None:
        assert isinstance(body, ChatBody)
        messages = body.messages
    ask = logprob_ask(
        body,
        wanted=bool(body.logprobs),
        count=whole_or_none(body.top_logprobs),
        count_param="top_logprobs",
        echo=False,
    )
    prompt = chat_prompt(messages, tokenizer, add_generation_prompt=body.add_generation_prompt)
    # Both budgets are declared, so a bad value in the one that loses is still a 400.
    max_tokens = whole_or_none(body.max_completion_tokens)
    if max_tokens is None:
        max_tokens = whole_or_none(body.max_tokens)
    structured = StructuredAsk(
        response_format=body.response_format,
        structured_outputs=body.structured_outputs,
        tools=None if body.tools is None else tuple(body.tools),
        tool_choice=body.tool_choice,
        parallel_tool_calls=body.parallel_tool_calls is not False,
        auto_tool_choice=auto_tool_choice,
    )
    return api_request(body, (prompt,), max_tokens, ask, structured)


def chat_prompt(
    messages: list[Message], tokenizer: Tokenizer, *, add_generation_prompt: bool | None
) -> Prompt:
    rendered = [message.for_template() for message in messages]
    try:
        text = tokenizer.apply_chat_template(
            rendered, add_generation_prompt=add_generation_prompt is not False
        )
    except ValueError as error:
        raise InvalidRequestError(f"the chat template failed: {error}", param="messages") from None
    return Prompt(tuple(tokenizer.encode(text, add_special_tokens=False)), text)
