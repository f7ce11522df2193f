"""Every example in `contracts/api.md` runs against the embedded SmolLM2 and must match."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from falcon import testing

from adapters.http.app import create_app
from adapters.http.serving import ModelHolder
from tests.support.asgi_stream import stream_post
from tests.support.sse import data_frames

pytestmark = [pytest.mark.slow, pytest.mark.model]

API_MD = Path(__file__).resolve().parents[2] / "contracts" / "api.md"
_BLOCK = re.compile(r"```(\w+)([^\n]*)\n(.*?)```", re.DOTALL)
_WILDCARDS = {
    "<string>": lambda v: isinstance(v, str),
    "<int>": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "<number>": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "<bool>": lambda v: isinstance(v, bool),
    "<any>": lambda v: True,
}


@dataclass(frozen=True)
class Example:
    method: str
    path: str
    body: dict | None
    kind: str
    status: int
    expected: str
    line: int

    def __str__(self) -> str:
        return f"api.md:{self.line} {self.method} {self.path}"


def parse_examples(text: str) -> list[Example]:
    """Pairs each ```http request block with the response block right after it."""
    blocks = [
        (m.group(1), m.group(2).strip(), m.group(3), text.count("\n", 0, m.start()) + 1)
        for m in _BLOCK.finditer(text)
    ]
    examples = []
    for (kind, _, request, line), (reply_kind, info, reply, _) in zip(
        blocks, blocks[1:], strict=False
    ):
        if kind != "http":
            continue
        first, _, rest = request.partition("\n")
        method, path = first.split()
        status = int(re.fullmatch(r"status=(\d+)", info).group(1))
        body = json.loads(rest) if rest.strip() else None
        examples.append(Example(method, path, body, reply_kind, status, reply, line))
    return examples


def matches(expected: object, actual: object, where: str = "$") -> None:
    """Exact equality, except wildcard strings, which match any value of their kind."""
    if isinstance(expected, str) and expected in _WILDCARDS:
        assert _WILDCARDS[expected](actual), f"{where}: {actual!r} is not {expected}"
    elif isinstance(expected, dict):
        got = sorted(actual) if isinstance(actual, dict) else actual
        assert isinstance(actual, dict) and set(actual) == set(expected), (
            f"{where}: keys {got} != {sorted(expected)}"
        )
        for key, value in expected.items():
            matches(value, actual[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), f"{where}: {actual!r}"
        for index, (want, got) in enumerate(zip(expected, actual, strict=True)):
            matches(want, got, f"{where}[{index}]")
    else:
        assert expected == actual, f"{where}: {actual!r} != {expected!r}"


def match_stream(expected: str, frames: list[str]) -> None:
    wanted = [line[len("data:") :].strip() for line in expected.strip().splitlines()]
    for index, want in enumerate(wanted):
        if want == "...":
            assert len(frames) >= index, "the stream ended early"
            return
        assert index < len(frames), f"frame {index} missing"
        if want == "[DONE]":
            assert frames[index] == "[DONE]"
        else:
            matches(json.loads(want), json.loads(frames[index]), f"frame {index}")
    assert len(frames) == len(wanted), f"{len(frames)} frames, the contract shows {len(wanted)}"


EXAMPLES = parse_examples(API_MD.read_text(encoding="utf-8"))


def test_api_md_has_examples_for_every_endpoint():
    paths = {example.path for example in EXAMPLES}

    assert {
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/models",
        "/tokenize",
        "/detokenize",
        "/v1/responses",
    } <= paths


def _stream_end(example: Example) -> bytes:
    """A Responses stream has no `[DONE]`; only its last event carries usage."""
    if example.path == "/v1/responses":
        return b'"usage": {"input_tokens"'
    return b"data: [DONE]"


@pytest.fixture(scope="module")
def app() -> Iterator[object]:
    # Imported here: they bring in torch, which collecting `make test-fast` should not pay for.
    from adapters.cli.asgi import load_served_model
    from adapters.cli.serve_config import ServeConfig
    from adapters.gpu.factory import RunnerSettings

    config = ServeConfig(
        runner=RunnerSettings(
            device="cpu",
            max_num_seqs=4,
            max_model_len=2048,
            kv_cache_bytes=96 << 20,
            prompt_logprobs=True,
        )
    )
    served = load_served_model(config)
    yield create_app(ModelHolder(served=served))
    served.stop()


@pytest.mark.parametrize("example", EXAMPLES, ids=str)
def test_api_md_example_holds(app, example: Example):
    if example.kind == "sse":
        status, text = stream_post(app, example.path, json=example.body, until=_stream_end(example))
        assert status == example.status
        match_stream(example.expected, data_frames(text))
        return
    client = testing.TestClient(app)
    result = client.simulate_request(example.method, example.path, json=example.body)

    assert result.status_code == example.status, result.text
    matches(json.loads(example.expected), result.json)
