"""A Responses `input` (a string or a list of items) as the chat messages its template renders."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from adapters.http.requests.decoding import is_text
from domain.common.errors import InvalidRequestError

_MESSAGE_ROLES = ("user", "system", "developer", "assistant")
# Keys an item may carry besides its content; output items handed back carry ids and status.
_MESSAGE_KEYS = {"type", "role", "content", "id", "status", "phase"}
_CALL_KEYS = {"type", "call_id", "name", "arguments", "id", "status", "namespace"}
_OUTPUT_KEYS = {"type", "call_id", "output", "id", "status"}
_REASONING_KEYS = {"type", "id", "summary", "content", "encrypted_content", "status"}
_TEXT_PARTS = ("input_text", "output_text")


def _fail(message: str) -> InvalidRequestError:
    return InvalidRequestError(message, param="input")


def input_messages(raw: Any) -> list[dict]:
    """The messages of `input`: a string is one user message; items keep their order.

    `developer` messages render as `system` (chat templates know no developer role); a
    `function_call` joins the assistant turn it follows as one of its `tool_calls`, and a
    `function_call_output` is a `tool` message. Reasoning items handed back are dropped, as
    chat templates drop earlier turns' reasoning.
    """
    if is_text(raw):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise _fail("`input` must be a string of valid Unicode or a non-empty list of items")
    messages: list[dict] = []
    for item in raw:
        if not isinstance(item, dict):
            raise _fail("each `input` item must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item))
        elif kind == "function_call":
            _add_call(messages, item)
        elif kind == "function_call_output":
            messages.append(_call_output(item))
        elif kind == "reasoning":
            _check_keys(item, _REASONING_KEYS, "reasoning")
        else:
            raise _fail(
                f"`input` items of type {kind!r} are not supported; use message, function_call, "
                "function_call_output or reasoning items"
            )
    return messages


def _check_keys(item: Mapping[str, object], allowed: set[str], kind: str) -> None:
    unknown = sorted(set(item) - allowed)
    if unknown:
        raise _fail(f"unknown field `{unknown[0]}` in a {kind} item of `input`")


def _message(item: Mapping[str, object]) -> dict:
    _check_keys(item, _MESSAGE_KEYS, "message")
    role = item.get("role")
    if role not in _MESSAGE_ROLES:
        raise _fail(f"each `input` message needs a role, one of {', '.join(_MESSAGE_ROLES)}")
    content = _text(item.get("content"), "message content")
    return {"role": "system" if role == "developer" else role, "content": content}


def _text(raw: Any, what: str) -> str:
    """A string, or a list of `input_text` / `output_text` parts joined."""
    if is_text(raw):
        return raw
    if not isinstance(raw, list):
        raise _fail(f"{what} must be a string of valid Unicode or a list of text parts")
    parts = []
    for part in raw:
        if (
            not isinstance(part, dict)
            or part.get("type") not in _TEXT_PARTS
            or not is_text(part.get("text"))
        ):
            raise _fail(
                f"{what} parts must be input_text or output_text parts with text; other "
                "kinds (images, files, audio) are not served"
            )
        parts.append(part["text"])
    return "".join(parts)


def _string(item: Mapping[str, object], name: str, kind: str) -> str:
    value = item.get(name)
    if not isinstance(value, str) or not is_text(value) or not value:
        raise _fail(f"a {kind} item of `input` needs `{name}`, a non-empty string")
    return value


def _add_call(messages: list[dict], item: Mapping[str, object]) -> None:
    _check_keys(item, _CALL_KEYS, "function_call")
    call = {
        "id": _string(item, "call_id", "function_call"),
        "type": "function",
        "function": {
            "name": _string(item, "name", "function_call"),
            "arguments": _arguments(item.get("arguments")),
        },
    }
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})


def _arguments(raw: Any) -> str:
    if not is_text(raw):
        raise _fail("a function_call item of `input` needs `arguments`, a string")
    return raw


def _call_output(item: Mapping[str, object]) -> dict:
    _check_keys(item, _OUTPUT_KEYS, "function_call_output")
    return {
        "role": "tool",
        "tool_call_id": _string(item, "call_id", "function_call_output"),
        "content": _text(item.get("output"), "function_call_output output"),
    }


def output_messages(output: Sequence[Mapping[str, Any]]) -> list[dict]:
    """A finished response's output items as the messages a follow-up's template renders:
    message text and function calls (in one assistant turn); reasoning is dropped."""
    messages: list[dict] = []
    for item in output:
        if item["type"] == "message":
            text = "".join(part["text"] for part in item["content"])
            messages.append({"role": "assistant", "content": text})
        elif item["type"] == "function_call":
            _add_call(
                messages,
                {
                    "type": "function_call",
                    "call_id": item["call_id"],
                    "name": item["name"],
                    "arguments": item["arguments"],
                },
            )
    return messages
