"""A matrix row as the request body each route takes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

COMPLETION_PROMPT = "the quick brown fox<think>"
USER_TEXT = "the quick brown fox"
MAX_TOKENS = 40
SEED = 7
TOP_P = 0.9
SELECTED_IDS = [5, 17, 99, 250]
PROMPT_TOP_K = 3
# Common in free text, absent from every grammar's and tool call's fixed parts.
STOP = " s"
MIN_TOKENS = 6
THINKING_BUDGET = 3
CLOSING_BIAS = 100
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}
REGEX = "(fox|dog)( [a-z]{1,4}){0,2}"
CHOICES = ["yes", "no", "maybe"]
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 6}},
    "required": ["city"],
    "additionalProperties": False,
}
FUNCTIONS = {"get_weather": WEATHER, "now": {"type": "object", "properties": {}}}
PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
PATHS["responses"] = "/v1/responses"


def request_body(row: Mapping[str, str], closing_token: int | None = None) -> dict[str, Any]:
    """Every factor of `row` in the fields its route spells it with; the stream flag too.

    `closing_token`: on a reasoning server, the reasoning's end token. A grammar or a forced
    call starts after the reasoning there, and the random tiny model almost never ends its
    reasoning by itself, so such rows bias sampling towards the end token: the reasoning closes
    at once and the constraint has an output to own. A bias changes sampling only, never a
    reported value, and the grammar's mask still rules every token it constrains."""
    api = row["api"]
    body: dict[str, Any] = {"return_tokens_as_token_ids": True}
    if api == "completions":
        body.update(prompt=COMPLETION_PROMPT, max_tokens=MAX_TOKENS, logprobs=int(row["logprobs"]))
    elif api == "chat":
        body["messages"] = [{"role": "user", "content": USER_TEXT}]
        body.update(max_tokens=MAX_TOKENS, logprobs=True, top_logprobs=int(row["logprobs"]))
    else:
        body.update(input=USER_TEXT, max_output_tokens=MAX_TOKENS)
        body.update(include=["message.output_text.logprobs"], top_logprobs=int(row["logprobs"]))
    if row["stream"] == "stream":
        body["stream"] = True
    if row["sampling"] == "greedy":
        body["temperature"] = 0
    else:
        body.update(temperature=1.0, top_p=TOP_P, seed=SEED)
    if row["token_ids"] == "ids":
        body["logprob_token_ids"] = SELECTED_IDS
    if row["prompt"] == "echo":
        body["echo"] = True
    elif row["prompt"] == "prompt_logprobs":
        body["prompt_logprobs"] = PROMPT_TOP_K
    if row["n"] != "1":
        body["n"] = int(row["n"])
    if row["stop"] == "stop":
        body["stop"] = [STOP]
    if row["min_tokens"] == "min":
        body["min_tokens"] = MIN_TOKENS
    body.update(_grammar(row["grammar"], api))
    body.update(_tools(row["tools"], api))
    constrained = row["grammar"] != "none" or row["tools"] in ("required", "named")
    if closing_token is not None and constrained:
        body["logit_bias"] = {str(closing_token): CLOSING_BIAS}
    if row["thinking"] == "budget":
        body["thinking_token_budget"] = THINKING_BUDGET
    return body


def _grammar(grammar: str, api: str) -> dict[str, Any]:
    if grammar == "json_schema":
        if api == "responses":
            return {"text": {"format": {"type": "json_schema", "name": "flag", "schema": SCHEMA}}}
        return {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "flag", "schema": SCHEMA},
            }
        }
    if grammar == "regex":
        return {"structured_outputs": {"regex": REGEX}}
    if grammar == "choice":
        return {"structured_outputs": {"choice": CHOICES}}
    return {}


def _tools(tools: str, api: str) -> dict[str, Any]:
    if tools == "none":
        return {}
    if api == "responses":
        listed: list[dict[str, Any]] = [
            {"type": "function", "name": name, "parameters": schema}
            for name, schema in FUNCTIONS.items()
        ]
        named: dict[str, Any] = {"type": "function", "name": "get_weather"}
    else:
        listed = [
            {"type": "function", "function": {"name": name, "parameters": schema}}
            for name, schema in FUNCTIONS.items()
        ]
        named = {"type": "function", "function": {"name": "get_weather"}}
    choice = {"required": "required", "named": named, "auto": "auto"}[tools]
    return {"tools": listed, "tool_choice": choice}


def without_prompt_logprobs(body: Mapping[str, Any]) -> dict[str, Any]:
    """The same request without echo or prompt logprobs: what a server without prompt scoring
    generates the same tokens for."""
    return {k: v for k, v in body.items() if k not in ("echo", "prompt_logprobs")}
