"""Issue 19's feature matrix: every pair of server and request features in some cell (a
generated pairwise covering table, tests/matrix/factors.py), each cell checking the contract's
invariants on the tiny models.

`HELIOS_MATRIX=full` runs the full product instead (`make test-matrix`; hours, not CI), and
`HELIOS_MATRIX=sample:N` a seeded sample of N of its cells (to time it).
docs/matrix.md lists the table, what each cell checks, and which cells are refused on purpose.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from falcon import testing

from tests.matrix import answers
from tests.matrix.checks import (
    REFERENCE_TOLERANCE,
    TP_TOLERANCE,
    check_completion_text,
    check_content_bytes,
    check_entries,
    check_entry_count,
    check_grammar,
    check_prompt_logprobs,
    check_refusal,
    check_thinking,
    check_tool_calls,
    same_answer,
)
from tests.matrix.factors import PARSER_SERVERS, cell_id, refusal_params, rows_for
from tests.matrix.requests import (
    MIN_TOKENS,
    PATHS,
    PROMPT_TOP_K,
    STOP,
    THINKING_BUDGET,
    request_body,
    without_prompt_logprobs,
)
from tests.matrix.servers import (
    BLOCK_SIZE,
    TINY_KV_BLOCKS,
    MatrixServer,
    MatrixServers,
    reference_rows,
)
from tests.support.asgi_stream import stream_post
from tests.support.generation_tap import Generation
from tests.support.tiny_serving import build_draft_model_dir, build_thinking_model_dir

pytestmark = [pytest.mark.model, pytest.mark.slow]

ROWS = rows_for(os.environ.get("HELIOS_MATRIX", "pairwise"))
# Servers whose feature leaves every token as a plain server would choose it, greedy or seeded
# (noise is keyed by seed and position): scoring, two ranks, preemption.
SAME_SAMPLES = ("tp2", "prompt-logprobs", "tiny-kv")
# Speculation keeps greedy tokens; seeded ones follow the same distribution, not the same draw.
SAME_GREEDY = ("ngram", "draft", *SAME_SAMPLES)
START_STRING, END_STRING = "<think>", "</think>"
# Generous: two ranks on two shared cores can be slow, and a stream cut short fails the cell.
STREAM_S = 180.0
METRICS_S = 10.0
FINAL_EVENT = b'"usage": {"input_tokens"'


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_thinking_model_dir(tmp_path_factory.mktemp("matrix"))


@pytest.fixture(scope="module")
def servers(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MatrixServers]:
    draft_dir = build_draft_model_dir(
        tmp_path_factory.mktemp("matrix-draft"), model_dir, noise=0.02
    )
    started = MatrixServers(model_dir, draft_dir)
    yield started
    started.close()


@pytest.fixture(scope="module")
def reference(model_dir: Path):
    return reference_rows(model_dir)


def send(server: MatrixServer, row: Mapping[str, str], body: dict) -> tuple[int, object]:
    """(status, payload): the JSON of a whole answer or a 400, the SSE text of a stream.

    A refused stream is refused before its first byte, so the plain client reads its 400 (and a
    200 that should have been a 400 still shows its status)."""
    path = PATHS[row["api"]]
    if body.get("stream") and not refusal_params(row):
        until = FINAL_EVENT if row["api"] == "responses" else b"data: [DONE]"
        status, text = stream_post(server.app, path, json=body, until=until, timeout=STREAM_S)
        assert status == 200, text
        return status, text
    result = testing.TestClient(server.app).simulate_post(path, json=body)
    return result.status_code, result.json


def read(row: Mapping[str, str], payload: object, prompt_len: int) -> answers.Answer:
    echo = row["prompt"] == "echo"
    if row["api"] == "completions":
        if isinstance(payload, str):
            return answers.completion_stream(payload, prompt_len, echo)
        return answers.completions(payload, prompt_len, echo)  # type: ignore[arg-type]
    if row["api"] == "chat":
        if isinstance(payload, str):
            return answers.chat_stream(payload)
        return answers.chat(payload)  # type: ignore[arg-type]
    if isinstance(payload, str):
        return answers.responses_stream(payload)
    return answers.responses(payload)  # type: ignore[arg-type]


def generated(server: MatrixServer, what: str) -> Generation:
    taken = server.tap.take()
    assert len(taken) == 1, f"{what}: {len(taken)} engine requests"
    generation = taken[0]
    assert generation.ended and generation.error is None, (what, generation.error)
    return generation


def closing_token(server: MatrixServer) -> int | None:
    """On a reasoning server, the end string's token that request bodies steer towards."""
    if server.name not in PARSER_SERVERS:
        return None
    (token,) = server.served.tokenizer.encode(END_STRING, add_special_tokens=False)
    return token


def grammar_text(row: Mapping[str, str], choice: answers.Choice, raw: str) -> str:
    """What the client reads as the constrained output: without a reasoning parser the whole
    output; with one, the content a chat or Responses client gets (the parser takes the
    reasoning out), and for completions the raw text after the reasoning's end, if any."""
    if row["server"] not in PARSER_SERVERS:
        return raw
    if row["api"] != "completions":
        return choice.text
    return raw.split(END_STRING, 1)[1] if END_STRING in raw else raw


@pytest.mark.parametrize(
    "row", [pytest.param(row, id=cell_id(i, row)) for i, row in enumerate(ROWS)]
)
def test_a_cell_keeps_every_invariant_of_the_contract(row, servers, reference):
    server = servers[row["server"]]
    server.tap.take()
    body = request_body(row, closing_token(server))
    refused = refusal_params(row)
    before = server.counts()
    status, payload = send(server, row, body)
    assert status != 500, payload
    if refused:
        check_refusal(status, payload, refused)  # type: ignore[arg-type]
        assert server.tap.take() == [], "a refused request reached the engine"
        return
    assert status == 200, payload
    generation = generated(server, "the cell's request")
    counted = counted_since(server, before, sum(map(len, generation.tokens.values())))
    answer = read(row, payload, len(generation.prompt))
    assert sorted(answer.choices) == list(range(int(row["n"])))

    # Streamed equals whole: the same request, not streamed, gives the same answer.
    if body.get("stream"):
        status, whole = send(server, row, {**body, "stream": False})
        assert status == 200, whole
        generated(server, "the whole twin")
        same_answer(read(row, whole, len(generation.prompt)), answer)

    tolerance = TP_TOLERANCE if row["server"] == "tp2" else REFERENCE_TOLERANCE
    for index, choice in answer.choices.items():
        rows = reference(list(generation.prompt) + generation.tokens[index])
        check_entries(choice, generation, rows, row, tolerance)
        if row["prompt"] == "prompt_logprobs":
            prompt_logprobs = answer.prompt_logprobs[index]
            check_prompt_logprobs(prompt_logprobs, generation.prompt, rows, PROMPT_TOP_K, tolerance)
        check_choice(row, choice, generation, server)
    if row["server"] == "tiny-kv":
        check_preemption(generation, counted["num_preemptions"])
    if same_tokens_as_plain(row):
        plain = servers["plain"]
        plain.tap.take()
        status, reply = send(plain, row, {**without_prompt_logprobs(body), "stream": False})
        assert status == 200, reply
        expected = generated(plain, "the plain server's twin")
        assert expected.prompt == generation.prompt
        assert expected.tokens == generation.tokens, "tokens differ from a plain server's"


def check_choice(
    row: Mapping[str, str], choice: answers.Choice, generation: Generation, server: MatrixServer
) -> None:
    """Text, bytes, counts, grammar, calls, budget and `min_tokens` of one choice."""
    tokenizer = server.served.tokenizer
    tokens = generation.tokens[choice.index]
    if row["api"] == "completions":
        prompt_text = tokenizer.decode(list(generation.prompt))
        check_completion_text(choice, prompt_text, row["prompt"] == "echo", tokenizer.decode)
    else:
        check_content_bytes(choice)
    # A stop string cuts any output short, a grammar's or a call's too (Responses has no
    # `stop_reason` to tell it, so the generated text does).
    cut = row["stop"] == "stop" and STOP in tokenizer.decode(tokens)
    ended = choice.finish_reason in ("stop", "tool_calls", "completed") and not cut
    # Counts hold where every token is the model's own content: no parser, no call.
    plain_content = row["server"] not in PARSER_SERVERS and row["tools"] == "none"
    if row["api"] != "responses" and plain_content and not cut:
        check_entry_count(choice, tokens, len(generation.prompt))
    if row["grammar"] != "none" and ended:
        check_grammar(row, grammar_text(row, choice, generation.texts[choice.index]))
    if row["tools"] in ("required", "named") and ended:
        check_tool_calls(row, choice)
    if row["thinking"] == "budget":
        start, end = (
            tokenizer.encode(text, add_special_tokens=False)[0]
            for text in (START_STRING, END_STRING)
        )
        check_thinking(tokens, start, end, THINKING_BUDGET)
    unconstrained = row["grammar"] == "none" and row["tools"] == "none"
    if row["min_tokens"] == "min" and unconstrained and ended:
        assert len(tokens) >= MIN_TOKENS, tokens


def counted_since(server: MatrixServer, before: dict[str, float], tokens: int) -> dict[str, float]:
    """What the server's counters added for one request that generated `tokens` tokens: the
    metrics count each generated token once (preempted or speculated alike), and never more
    accepted drafts than tokens. The last step's counts may land just after its answer."""
    deadline = time.monotonic() + METRICS_S
    while True:
        added = {name: value - before[name] for name, value in server.counts().items()}
        if added["generation_tokens"] >= tokens or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert added["generation_tokens"] == tokens, (added, tokens)
    assert added["spec_decode_num_accepted_tokens"] <= added["generation_tokens"], added
    return added


def check_preemption(generation: Generation, preempted: float) -> None:
    """Choices that together outgrew the tiny cache cannot all have stayed."""
    blocks = sum(
        -(-(len(generation.prompt) + len(tokens)) // BLOCK_SIZE)
        for tokens in generation.tokens.values()
    )
    if blocks > TINY_KV_BLOCKS:
        assert preempted > 0, f"{blocks} blocks fitted a cache of {TINY_KV_BLOCKS}"


def same_tokens_as_plain(row: Mapping[str, str]) -> bool:
    """Whether the row's server generates what the plain server does for the same request."""
    if row["server"] in PARSER_SERVERS:
        # A parser changes presentation only, but a grammar or a call starts after the reasoning.
        return row["thinking"] == "no" and row["tools"] == "none" and row["grammar"] == "none"
    return row["server"] in SAME_SAMPLES or (
        row["server"] in SAME_GREEDY and row["sampling"] == "greedy"
    )
