"""Request-body decoding: msgspec against attrs + cattrs, and against the field-by-field readers.

Run: `.venv/bin/python bench/request_decode.py [--baseline REF] [--rounds 5] [--calls 2000]`.

For each body kind (completions, chat, Responses, tokenize, detokenize) it times, in this one
process and on the same bytes:

- `before`: the readers this package replaced (`adapters/http/parsing.py`, `fields.py`,
  `responses_parsing.py` at `--baseline`, read from git): `json.loads` plus the reads and the
  build of the API request;
- `msgspec`: `decode` into the declared body, and decode plus the same build (`requests/`);
- `cattrs`: `json.loads` plus `Converter.structure` into attrs classes declaring the same
  fields, ranges and enums, with strict hooks (cattrs' own int hook would take "7" and 2.5).

A stub tokenizer keeps tokenization out of the numbers. Then it sends a battery of bad bodies
through both libraries and prints the message each gives. Results: docs/performance.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
import cattrs
import msgspec

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from adapters.http.requests import chat, completion, responses, tokenization  # noqa: E402
from adapters.http.requests.decoding import decimal_int, decode  # noqa: E402
from domain.common import ranges  # noqa: E402
from domain.common.errors import InvalidRequestError  # noqa: E402
from domain.common.ranges import IntRange, check_token_ids  # noqa: E402
from domain.responses.store import ResponseStore  # noqa: E402

# The last commit whose HTTP adapter read bodies field by field.
BASELINE = "eb0a858"
_OLD_MODULES = ("fields", "parsing", "responses_input", "responses_parsing")


class StubTokenizer:
    """Cheap and deterministic, so that the numbers are the body's, not the tokenizer's."""

    vocab_size = 50_000
    special_token_ids: frozenset[int] = frozenset()
    strips_leading_space = False

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return list(range(len(text) // 8 + 1))

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return "x" * len(token_ids)

    def token_bytes(self, token_id: int) -> bytes:
        return b"x"

    def apply_chat_template(self, messages: Sequence[Any], *, add_generation_prompt: bool = True):
        return "\n".join(f"{m['role']}: {m['content']}" for m in messages)


SAMPLING = {
    "temperature": 0.7,
    "top_p": 0.9,
    "top_k": 40,
    "seed": 11,
    "stop": ["\n\n", "END"],
    "presence_penalty": 0.5,
    "logit_bias": {"50": -3, "77": 2.5},
}
MESSAGES = [
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": [{"type": "text", "text": "Name three fruits."}]},
    {"role": "assistant", "content": "Apple, pear, plum."},
    {"role": "user", "content": "Why are they good?"},
]
BODIES: dict[str, dict] = {
    "completions": {
        "model": "m",
        "prompt": "The best fruit is",
        "max_tokens": 32,
        "logprobs": 5,
        "n": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
        **SAMPLING,
    },
    "chat": {
        "model": "m",
        "messages": MESSAGES,
        "max_completion_tokens": 64,
        "logprobs": True,
        "top_logprobs": 5,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        **SAMPLING,
    },
    "responses": {
        "model": "m",
        "input": [
            {"role": "developer", "content": "be brief"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        ],
        "instructions": "be kind",
        "max_output_tokens": 64,
        "include": ["message.output_text.logprobs"],
        "top_logprobs": 3,
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "tool_choice": "none",
        "metadata": {"k": "v"},
        "reasoning": {"effort": "low"},
        "text": {"format": {"type": "json_schema", "name": "t", "schema": {"type": "object"}}},
        "temperature": 0.5,
        "seed": 3,
    },
    "tokenize": {"model": "m", "prompt": "The best fruit is " * 8, "add_special_tokens": False},
    "detokenize": {"model": "m", "tokens": list(range(100, 300))},
}


# --- today's readers, read from git -------------------------------------------------------


def load_baseline(ref: str) -> Any:
    """The replaced modules at `ref` as a package of their own (they import one another)."""
    folder = Path(tempfile.mkdtemp(prefix="helios-baseline-"))
    package = folder / "_baseline_http"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in _OLD_MODULES:
        source = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{ref}:adapters/http/{name}.py"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        (package / f"{name}.py").write_text(source.replace("adapters.http.", "_baseline_http."))
    sys.path.insert(0, str(folder))
    import _baseline_http.fields as fields
    import _baseline_http.parsing as parsing
    import _baseline_http.responses_parsing as responses_parsing

    return fields, parsing, responses_parsing


def before_readers(ref: str) -> dict[str, Callable[[bytes], object]]:
    fields, parsing, responses_parsing = load_baseline(ref)
    tokenizer, store = StubTokenizer(), ResponseStore()

    def loads(raw: bytes) -> Any:
        return json.loads(raw, parse_int=decimal_int)

    def tokenize(raw: bytes) -> object:
        # As `TokenizeResource` read a prompt body at the baseline.
        body = fields.read_object(loads(raw))
        prompt = fields.read_str(body, "prompt", None)
        special = fields.read_bool(body, "add_special_tokens", True)
        return tokenizer.encode(prompt, add_special_tokens=special), fields.read_str(
            body, "model", None
        )

    def detokenize(raw: bytes) -> object:
        body = fields.read_object(loads(raw))
        tokens = fields.read_int_list(body, "tokens")
        check_token_ids(tokens, tokenizer.vocab_size, "tokens")
        return tokens, fields.read_str(body, "model", None)

    return {
        "completions": lambda raw: parsing.completion_request(loads(raw), tokenizer),
        "chat": lambda raw: parsing.chat_request(loads(raw), tokenizer),
        "responses": lambda raw: responses_parsing.responses_request(loads(raw), tokenizer, store),
        "tokenize": tokenize,
        "detokenize": detokenize,
    }


def msgspec_builds() -> dict[str, Callable[[bytes], object]]:
    tokenizer, store = StubTokenizer(), ResponseStore()
    return {
        "completions": lambda raw: completion.completion_request(raw, tokenizer),
        "chat": lambda raw: chat.chat_request(raw, tokenizer),
        "responses": lambda raw: responses.responses_request(raw, tokenizer, store),
        "tokenize": lambda raw: tokenization.tokenize_request(raw, tokenizer),
        "detokenize": lambda raw: tokenization.detokenize_request(raw, tokenizer.vocab_size),
    }


MSGSPEC_BODIES: dict[str, type] = {
    "completions": completion.CompletionBody,
    "chat": chat.ChatBody,
    "responses": responses.ResponsesBody,
    "tokenize": tokenization.TokenizeBody,
    "detokenize": tokenization.DetokenizeBody,
}


# --- the same declarations in attrs, structured by cattrs ---------------------------------


def _within(bounds: IntRange) -> Any:
    return attrs.validators.optional(
        [attrs.validators.ge(bounds.low), attrs.validators.le(bounds.high)]
    )


def _field(bounds: IntRange | None = None) -> Any:
    return attrs.field(default=None, validator=None if bounds is None else _within(bounds))


@attrs.frozen
class StreamOptionsA:
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


@attrs.frozen(kw_only=True)
class SamplingA:
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = _field(ranges.TOP_K)
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = _field(ranges.SEED)
    stop: str | list[str] | None = None
    ignore_eos: bool | None = None
    min_tokens: int | None = _field(ranges.MIN_TOKENS)
    logit_bias: dict[str, float] | None = None


@attrs.frozen(kw_only=True)
class GenerationA(SamplingA):
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    model: str | None = None
    n: int | None = _field(ranges.CHOICES)
    stream: bool | None = None
    stream_options: StreamOptionsA | None = None
    logprob_token_ids: list[int] | None = None
    prompt_logprobs: int | None = None
    return_tokens_as_token_ids: bool | None = None
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    thinking_token_budget: int | None = None


@attrs.frozen(kw_only=True)
class CompletionA(GenerationA):
    prompt: Any = None
    max_tokens: int | None = _field(ranges.COMPLETION_MAX_TOKENS)
    logprobs: int | None = None
    echo: bool | None = None


@attrs.frozen
class TextPartA:
    type: Literal["text"]
    text: str


@attrs.frozen(kw_only=True)
class MessageA:
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPartA] | None = None
    tool_calls: list[dict[str, Any]] | None = None


@attrs.frozen(kw_only=True)
class ChatA(GenerationA):
    messages: list[MessageA]
    logprobs: bool | None = None
    top_logprobs: int | None = None
    max_tokens: int | None = _field(ranges.TOKEN_BUDGET)
    max_completion_tokens: int | None = _field(ranges.TOKEN_BUDGET)
    add_generation_prompt: bool | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None


@attrs.frozen
class FormatA:
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


@attrs.frozen
class TextA:
    format: FormatA | None = None
    verbosity: None = None


@attrs.frozen
class ReasoningA:
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    summary: None = None
    generate_summary: None = None


@attrs.frozen(kw_only=True)
class ResponsesA(SamplingA):
    input: str | list[dict[str, Any]] | None = None
    model: str | None = None
    instructions: str | None = None
    max_output_tokens: int | None = _field(ranges.TOKEN_BUDGET)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    include: list[str] | None = None
    top_logprobs: int | None = None
    stream: bool | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    text: TextA | None = None
    reasoning: ReasoningA | None = None
    user: str | None = None
    logprob_token_ids: list[int] | None = None


@attrs.frozen(kw_only=True)
class TokenizeA(ChatA):
    messages: list[MessageA] | None = None  # type: ignore[assignment]
    prompt: str | None = None
    add_special_tokens: bool | None = None


@attrs.frozen(kw_only=True)
class DetokenizeA:
    tokens: list[int] | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(
            attrs.validators.deep_iterable(_within(ranges.TOKEN_ID))  # type: ignore[arg-type]
        ),
    )
    model: str | None = None


ATTRS_BODIES: dict[str, type] = {
    "completions": CompletionA,
    "chat": ChatA,
    "responses": ResponsesA,
    "tokenize": TokenizeA,
    "detokenize": DetokenizeA,
}


def strict_converter() -> cattrs.Converter:
    """cattrs with JSON's types held strictly, as the server holds them."""
    converter = cattrs.Converter(detailed_validation=True, forbid_extra_keys=False)

    def integer(value: Any, _: type) -> int:
        whole = isinstance(value, float) and value.is_integer()
        if isinstance(value, bool) or not (isinstance(value, int) or whole):
            raise TypeError(f"expected an integer, got {type(value).__name__}")
        return int(value)

    def number(value: Any, _: type) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"expected a number, got {type(value).__name__}")
        return float(value)

    def flag(value: Any, _: type) -> bool:
        if not isinstance(value, bool):
            raise TypeError(f"expected a boolean, got {type(value).__name__}")
        return value

    def text(value: Any, _: type) -> str:
        if not isinstance(value, str):
            raise TypeError(f"expected a string, got {type(value).__name__}")
        return value

    converter.register_structure_hook(int, integer)
    converter.register_structure_hook(float, number)
    converter.register_structure_hook(bool, flag)
    converter.register_structure_hook(str, text)
    converter.register_structure_hook(Any, lambda value, _: value)

    def unset(value: Any, _: type) -> None:
        if value is not None:
            raise ValueError("expected null: not served")

    converter.register_structure_hook(type(None), unset)

    def stop(value: Any, _: type) -> str | list[str]:
        return value if isinstance(value, str) else converter.structure(value, list[str])

    def content(value: Any, _: type) -> str | list[TextPartA] | None:
        if value is None or isinstance(value, str):
            return value
        return converter.structure(value, list[TextPartA])

    def items(value: Any, _: type) -> str | list[dict[str, Any]] | None:
        if value is None or isinstance(value, str):
            return value
        return converter.structure(value, list[dict[str, Any]])

    converter.register_structure_hook(str | list[str] | None, stop)
    converter.register_structure_hook(str | list[TextPartA] | None, content)
    converter.register_structure_hook(str | list[dict[str, Any]] | None, items)
    return converter


def cattrs_decoders() -> dict[str, Callable[[bytes], object]]:
    converter = strict_converter()

    def decoder(body: type) -> Callable[[bytes], object]:
        return lambda raw: converter.structure(json.loads(raw, parse_int=decimal_int), body)

    return {kind: decoder(body) for kind, body in ATTRS_BODIES.items()}


def cattrs_message(raw: bytes, body: type) -> str:
    try:
        strict_converter().structure(json.loads(raw, parse_int=decimal_int), body)
    except Exception as error:  # noqa: BLE001 - every library error is shown
        return "; ".join(cattrs.transform_error(error))
    return "(accepted)"


def msgspec_message(raw: bytes, body: type) -> str:
    try:
        decode(raw, body)
    except InvalidRequestError as error:
        return f"[{error.param}] {error.message}"
    return "(accepted)"


# --- timing -------------------------------------------------------------------------------


def per_call_us(function: Callable[[bytes], object], raw: bytes, calls: int, rounds: int) -> float:
    """The best round's mean time per call, in microseconds."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            function(raw)
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


BAD: tuple[tuple[str, dict], ...] = (
    ("completions", {"prompt": "x", "temperature": "hot"}),
    ("completions", {"prompt": "x", "max_tokens": 2.5}),
    ("completions", {"prompt": "x", "n": 99}),
    ("completions", {"prompt": "x", "stream_options": {"include_usage": 1}}),
    ("completions", {"prompt": "x", "logit_bias": {"5": "high"}}),
    ("completions", {"prompt": "x", "stop_token_ids": [1, "a"]}),
    ("chat", {"messages": [{"role": "robot", "content": "x"}]}),
    ("chat", {"messages": [{"content": "x"}]}),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
    ("chat", {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}),
    ("responses", {"input": "x", "reasoning": {"effort": "huge"}}),
    ("responses", {"input": "x", "metadata": {"k": 1}}),
    ("responses", {"input": "x", "text": {"format": {"type": "yaml"}}}),
    ("detokenize", {"tokens": [1, -2]}),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=BASELINE, help="git revision of today's readers")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    before = before_readers(args.baseline)
    built = msgspec_builds()
    structured = cattrs_decoders()
    print(
        f"{platform.processor() or platform.machine()}, Python {platform.python_version()}, "
        f"msgspec {msgspec.__version__}, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC"
    )
    print(f"microseconds per body, best of {args.rounds} rounds of {args.calls} calls\n")
    header = (
        "| body | bytes | json.loads | before (json + readers + build) | msgspec decode "
        "| msgspec decode + build | cattrs decode (json + structure) | msgspec build / before "
        "| cattrs / msgspec decode |"
    )
    print(header)
    print("|---" * 9 + "|")
    for kind, body in BODIES.items():
        raw = json.dumps(body).encode()
        loads = per_call_us(json.loads, raw, args.calls, args.rounds)
        old = per_call_us(before[kind], raw, args.calls, args.rounds)
        kind_body = MSGSPEC_BODIES[kind]
        ours = per_call_us(lambda r, b=kind_body: decode(r, b), raw, args.calls, args.rounds)
        ours_built = per_call_us(built[kind], raw, args.calls, args.rounds)
        theirs = per_call_us(structured[kind], raw, args.calls, args.rounds)
        print(
            f"| {kind} | {len(raw)} | {loads:.1f} | {old:.1f} | {ours:.1f} | {ours_built:.1f} "
            f"| {theirs:.1f} | {ours_built / old:.2f} | {theirs / ours:.1f} |"
        )
    print("\nError messages for bad bodies ([param] and message as the envelope carries them)\n")
    print("| body | sent | msgspec, through `decoding.invalid` | cattrs `transform_error` |")
    print("|---|---|---|---|")
    for kind, body in BAD:
        raw = json.dumps(body).encode()
        ours_says = msgspec_message(raw, MSGSPEC_BODIES[kind])
        theirs_says = cattrs_message(raw, ATTRS_BODIES[kind])
        shown = json.dumps(body)
        cells = (kind, f"`{shown}`", ours_says, theirs_says)
        print("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")


if __name__ == "__main__":
    main()
