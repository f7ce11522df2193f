"""Every route's answer, whole or streamed, read into one shape the matrix checks compare."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tests.support.sse import json_frames

TOKEN_PREFIX = "token_id:"


@dataclass
class Entry:
    """One logprob entry: the chosen token, its value, the listed alternatives in wire order,
    and, where the route has them, its raw bytes (chat, Responses) or text offset (completions)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]
    raw: bytes | None = None
    offset: int | None = None


@dataclass
class Choice:
    index: int
    text: str = ""
    reasoning: str = ""
    entries: list[Entry] = field(default_factory=list)
    # Completions echo: the prompt's entries (the first None), kept apart from `entries`.
    prompt_entries: list[Entry | None] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: Any = None
    tool_calls: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Answer:
    """A 200's choices (by index) and their prompt logprobs (chat's request-level list, or each
    completions choice's own)."""

    choices: dict[int, Choice]
    prompt_logprobs: dict[int, list | None]


def token_id(name: str) -> int:
    assert name.startswith(TOKEN_PREFIX), f"token {name!r} is not named by its ID"
    return int(name.removeprefix(TOKEN_PREFIX))


def _completion_entries(logprobs: dict | None) -> list[Entry | None]:
    if not logprobs:
        return []
    found: list[Entry | None] = []
    for name, value, top, offset in zip(
        logprobs["tokens"],
        logprobs["token_logprobs"],
        logprobs["top_logprobs"],
        logprobs["text_offset"],
        strict=True,
    ):
        if value is None:
            assert top is None, "a null entry has null alternatives"
            found.append(None)
            continue
        listed = [(token_id(key), alternative) for key, alternative in top.items()]
        found.append(Entry(token_id(name), value, listed, offset=offset))
    return found


def _content_entry(entry: dict) -> Entry:
    top = [(token_id(t["token"]), t["logprob"]) for t in entry["top_logprobs"]]
    return Entry(token_id(entry["token"]), entry["logprob"], top, raw=bytes(entry["bytes"]))


def completions(payload: dict, prompt_len: int, echo: bool) -> Answer:
    choices: dict[int, Choice] = {}
    prompts: dict[int, list | None] = {}
    for raw in payload["choices"]:
        entries = _completion_entries(raw["logprobs"])
        cut = prompt_len if echo else 0
        choice = Choice(raw["index"], raw["text"], finish_reason=raw["finish_reason"])
        choice.stop_reason = raw["stop_reason"]
        choice.prompt_entries = entries[:cut]
        choice.entries = [e for e in entries[cut:] if e is not None]
        assert len(choice.entries) == len(entries) - cut, "a generated entry is null"
        choices[choice.index] = choice
        prompts[choice.index] = raw.get("prompt_logprobs")
    return Answer(choices, prompts)


def completion_stream(body: str, prompt_len: int, echo: bool) -> Answer:
    merged: dict[int, dict] = {}
    for chunk in json_frames(body):
        assert "error" not in chunk, chunk
        for raw in chunk["choices"]:
            into = merged.setdefault(
                raw["index"],
                {"index": raw["index"], "text": "", "logprobs": None, "finish_reason": None},
            )
            into["text"] += raw["text"]
            if raw.get("logprobs"):
                into["logprobs"] = into["logprobs"] or {
                    "tokens": [],
                    "token_logprobs": [],
                    "top_logprobs": [],
                    "text_offset": [],
                }
                for key in into["logprobs"]:
                    into["logprobs"][key] += raw["logprobs"][key]
            if raw.get("finish_reason") is not None:
                into["finish_reason"] = raw["finish_reason"]
                into["stop_reason"] = raw.get("stop_reason")
    for into in merged.values():
        into.setdefault("stop_reason", None)
    return completions({"choices": list(merged.values())}, prompt_len, echo)


def chat(payload: dict) -> Answer:
    choices: dict[int, Choice] = {}
    for raw in payload["choices"]:
        message = raw["message"]
        choice = Choice(raw["index"], message.get("content") or "")
        choice.reasoning = message.get("reasoning_content") or ""
        choice.finish_reason, choice.stop_reason = raw["finish_reason"], raw.get("stop_reason")
        choice.tool_calls = [
            (call["function"]["name"], call["function"]["arguments"])
            for call in message.get("tool_calls") or []
        ]
        content = (raw.get("logprobs") or {}).get("content") or []
        choice.entries = [_content_entry(e) for e in content]
        choices[choice.index] = choice
    prompt = payload.get("prompt_logprobs")
    return Answer(choices, dict.fromkeys(choices, prompt))


def chat_stream(body: str) -> Answer:
    choices: dict[int, Choice] = {}
    calls: dict[int, dict[int, list[str]]] = {}
    for chunk in json_frames(body):
        assert "error" not in chunk, chunk
        for raw in chunk["choices"]:
            choice = choices.setdefault(raw["index"], Choice(raw["index"]))
            delta = raw.get("delta") or {}
            choice.text += delta.get("content") or ""
            choice.reasoning += delta.get("reasoning_content") or ""
            for call in delta.get("tool_calls") or []:
                into = calls.setdefault(choice.index, {}).setdefault(call["index"], ["", ""])
                function = call.get("function") or {}
                into[0] += function.get("name") or ""
                into[1] += function.get("arguments") or ""
            content = (raw.get("logprobs") or {}).get("content") or []
            choice.entries += [_content_entry(e) for e in content]
            if raw.get("finish_reason") is not None:
                choice.finish_reason, choice.stop_reason = (
                    raw["finish_reason"],
                    raw.get("stop_reason"),
                )
    for index, found in calls.items():
        choices[index].tool_calls = [(name, args) for name, args in found.values()]
    return Answer(choices, dict.fromkeys(choices))


def responses(payload: dict) -> Answer:
    choice = Choice(0)
    for item in payload["output"]:
        if item["type"] == "message":
            part = item["content"][0]
            choice.text += part["text"]
            choice.entries += [_content_entry(e) for e in part["logprobs"]]
        elif item["type"] == "reasoning":
            choice.reasoning += "".join(c["text"] for c in item["content"])
        elif item["type"] == "function_call":
            choice.tool_calls.append((item["name"], item["arguments"]))
    choice.finish_reason = payload["status"]
    return Answer({0: choice}, {0: None})


def responses_stream(body: str) -> Answer:
    """The final event's response, once the deltas are seen to add up to it (the reasoning,
    the text, its entries and the calls' arguments)."""
    events = [
        json.loads(block.split("\ndata: ", 1)[1]) for block in body.strip().split("\n\n") if block
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]
    assert final["type"] in ("response.completed", "response.incomplete"), final
    told = Choice(0)
    for event in events:
        if event["type"] == "response.output_text.delta":
            told.text += event["delta"]
            told.entries += [_content_entry(e) for e in event["logprobs"]]
        elif event["type"] == "response.reasoning_text.delta":
            told.reasoning += event["delta"]
        elif event["type"] == "response.function_call_arguments.done":
            told.tool_calls.append((event.get("name", ""), event["arguments"]))
    answer = responses(final["response"])
    whole = answer.choices[0]
    assert (told.text, told.reasoning) == (whole.text, whole.reasoning)
    assert told.entries == whole.entries
    assert [a for _, a in told.tool_calls] == [a for _, a in whole.tool_calls]
    return answer
