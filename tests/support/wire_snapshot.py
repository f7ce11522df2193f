"""Records the wire bytes of a fixed request set, to prove a refactor changes none of them.

`python -m tests.support.wire_snapshot OUT [--raw]` serves the embedded SmolLM2 in-process (prompt
scoring on) and writes one JSON line per request: the api.md examples, then seeded requests
covering logprobs, echo, streaming, n > 1, stop strings, selected IDs and errors. Response IDs
and timestamps are replaced by placeholders; everything else is the server's bytes, re-encoded
with sorted keys. Run it before and after a change and compare the files byte for byte.

`--raw` keeps each response's body as sent instead (key order, float text and whitespace as the
server wrote them; IDs and times still replaced), for changes to how JSON is written.
`--async-scheduling` serves with the overlapped engine loop, whose wire equals the synchronous
loop's but for row-count rounding where a lane planned ahead joins a step (contracts/api.md,
"Async scheduling").

The server runs with its defaults, the prefix cache included: requests that repeat a prompt read
its cached blocks, so their usage names cached tokens and their values may move in the last
bits. `--no-prefix-caching` turns the cache off, for a comparison with a recording made before
the cache existed.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from falcon import testing

from adapters.cli.asgi import load_served_model
from adapters.cli.serve_config import ServeConfig
from adapters.gpu.factory import RunnerSettings
from adapters.http.app import create_app
from adapters.http.serving import ModelHolder
from tests.support.asgi_stream import stream_post
from tests.support.sse import data_frames

API_MD = Path(__file__).resolve().parents[2] / "contracts" / "api.md"
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
QUESTION = [{"role": "user", "content": "Name three fruits and say why they are good."}]
SAMPLED = {"temperature": 0.9, "top_p": 0.95, "seed": 11}

SEEDED: tuple[tuple[str, dict], ...] = (
    (COMPLETIONS, {"prompt": "The best fruit is", "max_tokens": 12, "logprobs": 5, **SAMPLED}),
    (
        COMPLETIONS,
        {"prompt": "Once upon a time", "max_tokens": 10, "n": 3, "logprobs": 2, **SAMPLED},
    ),
    (
        COMPLETIONS,
        {
            "prompt": ["One, two,", "Red, green,"],
            "n": 2,
            "max_tokens": 8,
            "echo": True,
            "logprobs": 1,
            **SAMPLED,
        },
    ),
    (
        COMPLETIONS,
        {"prompt": [504, 3575, 282, 4649, 314], "echo": True, "logprobs": 3, "max_tokens": 0},
    ),
    (
        COMPLETIONS,
        {
            "prompt": "The capital of France is",
            "echo": True,
            "logprobs": 1,
            "max_tokens": 4,
            "temperature": 0,
            "stop": [","],
        },
    ),
    (
        COMPLETIONS,
        {
            "prompt": "Count: one, two,",
            "max_tokens": 16,
            "temperature": 0,
            "logprobs": 2,
            "stop": [" five", "\n"],
        },
    ),
    (
        COMPLETIONS,
        {
            "prompt": "Count: one, two,",
            "max_tokens": 16,
            "temperature": 0,
            "logprobs": 2,
            "stop": [" five"],
            "include_stop_str_in_output": True,
        },
    ),
    (
        COMPLETIONS,
        {
            "prompt": "Is Paris in France? Answer:",
            "max_tokens": 3,
            "logprobs": 0,
            "logprob_token_ids": [9230, 2838, 2],
            **SAMPLED,
        },
    ),
    (
        COMPLETIONS,
        {
            "prompt": "Tell me a story",
            "max_tokens": 6,
            "logprobs": 4,
            "return_tokens_as_token_ids": True,
            "presence_penalty": 1.0,
            "logit_bias": {"30": -5},
            **SAMPLED,
        },
    ),
    (
        COMPLETIONS,
        {
            "prompt": "The capital of France is",
            "prompt_logprobs": 3,
            "max_tokens": 2,
            "temperature": 0,
        },
    ),
    (
        COMPLETIONS,
        {
            "prompt": "Once upon a time",
            "max_tokens": 8,
            "logprobs": 3,
            "stream": True,
            "n": 2,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            **SAMPLED,
        },
    ),
    (
        COMPLETIONS,
        {
            "prompt": "The capital of France is",
            "echo": True,
            "logprobs": 2,
            "max_tokens": 3,
            "stream": True,
            "temperature": 0,
        },
    ),
    (
        CHAT,
        {"messages": QUESTION, "max_tokens": 24, "logprobs": True, "top_logprobs": 5, **SAMPLED},
    ),
    (
        CHAT,
        {
            "messages": QUESTION,
            "max_tokens": 12,
            "n": 2,
            "logprobs": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            **SAMPLED,
        },
    ),
    (
        CHAT,
        {
            "messages": QUESTION,
            "max_tokens": 20,
            "temperature": 0,
            "stop": ["."],
            "logprobs": True,
            "top_logprobs": 2,
            "prompt_logprobs": 1,
        },
    ),
    (
        CHAT,
        {
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 30,
            "temperature": 0,
            "logprobs": True,
            "logprob_token_ids": [2, 30],
        },
    ),
    (COMPLETIONS, {"prompt": "Hi", "logprobs": 21}),
    (COMPLETIONS, {"prompt": "Hi", "max_tokens": 0}),
    (CHAT, {"messages": [{"role": "user", "content": "Hi"}], "top_logprobs": 2}),
)


_IDS = frozenset({"id", "item_id"})
_RAW_IDS = re.compile(r'("(?:id|item_id)": ?)"[^"]*"')
_RAW_TIMES = re.compile(r'("(?:created|created_at)": ?)[0-9]+')
_TIMES = frozenset({"created", "created_at"})


def _normalized(value: object) -> object:
    """IDs and creation times differ per run; they become placeholders (the Responses API
    names its times `created_at` and its events point at items by `item_id`)."""
    if isinstance(value, dict):
        return {
            key: "<id>" if key in _IDS else 0 if key in _TIMES else _normalized(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_normalized(item) for item in value]
    return value


def _api_md_requests() -> list[tuple[str, str, dict | None]]:
    from tests.contract.test_api_md import parse_examples

    return [
        (example.method, example.path, example.body)
        for example in parse_examples(API_MD.read_text(encoding="utf-8"))
    ]


def _raw(text: str) -> str:
    return _RAW_TIMES.sub(r"\g<1>0", _RAW_IDS.sub(r'\g<1>"<id>"', text))


def record_one(app: object, method: str, path: str, body: dict | None, *, raw: bool) -> dict:
    """One request's answer as the snapshot writes it (IDs and times replaced)."""
    if body is not None and body.get("stream"):
        status, text = stream_post(app, path, json=body)
        if raw:
            return {"path": path, "request": body, "status": status, "raw": _raw(text)}
        frames = [frame if frame == "[DONE]" else json.loads(frame) for frame in data_frames(text)]
        return {"path": path, "request": body, "status": status, "frames": _normalized(frames)}
    result = testing.TestClient(app).simulate_request(method, path, json=body)
    if raw:
        status, text = result.status_code, result.text
        return {"path": path, "request": body, "status": status, "raw": _raw(text)}
    return {
        "path": path,
        "request": body,
        "status": result.status_code,
        "body": _normalized(result.json),
    }


def record(
    output: Path, *, raw: bool = False, async_scheduling: bool = False, prefix_caching: bool = True
) -> int:
    config = ServeConfig(
        async_scheduling=async_scheduling,
        prefix_caching="sha256" if prefix_caching else None,
        runner=RunnerSettings(
            device="cpu",
            max_num_seqs=4,
            max_model_len=2048,
            kv_cache_bytes=96 << 20,
            prompt_logprobs=True,
        ),
    )
    served = load_served_model(config)
    try:
        app = create_app(ModelHolder(served=served))
        requests = _api_md_requests() + [("POST", path, body) for path, body in SEEDED]
        with output.open("w", encoding="utf-8") as sink:
            for method, path, body in requests:
                line = record_one(app, method, path, body, raw=raw)
                sink.write(json.dumps(line, sort_keys=True) + "\n")
    finally:
        served.stop()
    return len(requests)


if __name__ == "__main__":
    flags = sys.argv[2:]
    count = record(
        Path(sys.argv[1]),
        raw="--raw" in flags,
        async_scheduling="--async-scheduling" in flags,
        prefix_caching="--no-prefix-caching" not in flags,
    )
    print(f"recorded {count} responses into {sys.argv[1]}")
