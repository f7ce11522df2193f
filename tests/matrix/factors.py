"""The feature matrix of issue 19: its factors, the combinations that cannot be sent, and the
documented 400s a cell must get instead of an answer.

Two kinds of impossible combination, kept apart on purpose:

- constraints (`expressible`): the request cannot even say it. `echo` exists on completions only
  (chat ignores unknown fields, so an `echo` there would test nothing) and `tools` on chat and
  Responses only (completions ignore them). The generator never builds these rows.
- refusals (`refusal_params`): the request says it and contracts/api.md answers with a 400
  naming a field. These rows are generated like any other, and their cell asserts the 400.

`python -m tests.matrix.factors` prints the pairwise table (markdown) that docs/matrix.md holds,
`--write-doc` writes it there, and `--full` prints the full product's size instead.
"""

from __future__ import annotations

import functools
import random
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.matrix.covering import Factor, Row, full_product, pairwise, required_pairs

SERVERS = ("plain", "ngram", "draft", "tp2", "qwen3", "deepseek_r1", "prompt-logprobs", "tiny-kv")
# Servers with `--reasoning-parser X --tool-call-parser hermes --enable-auto-tool-choice`.
PARSER_SERVERS = ("qwen3", "deepseek_r1")
FORCED_TOOLS = ("required", "named")

FACTORS = (
    Factor("server", SERVERS),
    Factor("api", ("completions", "chat", "responses")),
    Factor("stream", ("whole", "stream")),
    Factor("sampling", ("greedy", "seeded-top-p")),
    Factor("logprobs", ("0", "5", "20")),
    Factor("token_ids", ("no", "ids")),
    Factor("prompt", ("none", "echo", "prompt_logprobs")),
    Factor("n", ("1", "2")),
    Factor("stop", ("no", "stop")),
    Factor("min_tokens", ("no", "min")),
    Factor("grammar", ("none", "json_schema", "regex", "choice")),
    Factor("tools", ("none", "required", "named", "auto")),
    Factor("thinking", ("no", "budget")),
)
SEED = 19


def expressible(row: Mapping[str, str]) -> bool:
    """False for combinations a request cannot express (see the module docstring)."""
    api = row.get("api")
    if api is None:
        return True
    if row.get("prompt") == "echo" and api != "completions":
        return False
    return not (row.get("tools", "none") != "none" and api == "completions")


@dataclass(frozen=True)
class Refusal:
    """A documented 400: `applies` reads only `factors`, and the 400 names `param`."""

    factors: tuple[str, ...]
    applies: Callable[[Mapping[str, str]], bool]
    param: str
    why: str


REFUSALS = (
    # Responses names every field it does not serve (contracts/api.md, "Responses API").
    Refusal(
        ("api", "n"),
        lambda r: r["api"] == "responses" and r["n"] != "1",
        "n",
        "Responses serves one answer: `n` is an unknown field",
    ),
    Refusal(
        ("api", "prompt"),
        lambda r: r["api"] == "responses" and r["prompt"] != "none",
        "prompt_logprobs",
        "Responses has no prompt logprobs: an unknown field",
    ),
    Refusal(
        ("api", "thinking"),
        lambda r: r["api"] == "responses" and r["thinking"] != "no",
        "thinking_token_budget",
        "Responses does not take `thinking_token_budget`",
    ),
    Refusal(
        ("prompt", "token_ids"),
        lambda r: r["prompt"] == "echo" and r["token_ids"] != "no",
        "logprob_token_ids",
        "echo reports natural alternatives only (Logprobs, errors)",
    ),
    Refusal(
        ("prompt", "stream"),
        lambda r: r["prompt"] == "prompt_logprobs" and r["stream"] == "stream",
        "prompt_logprobs",
        "`prompt_logprobs` with `stream: true` (Prompt logprobs)",
    ),
    Refusal(
        ("prompt", "server"),
        lambda r: r["prompt"] != "none" and r["server"] != "prompt-logprobs",
        "prompt_logprobs",
        "prompt logprobs need `--prompt-logprobs` (Prompt logprobs)",
    ),
    Refusal(
        ("tools", "server"),
        lambda r: r["tools"] == "auto" and r["server"] not in PARSER_SERVERS,
        "tool_choice",
        "`auto` needs `--enable-auto-tool-choice` (Structured outputs)",
    ),
    Refusal(
        ("thinking", "server"),
        lambda r: r["thinking"] != "no" and r["server"] not in PARSER_SERVERS,
        "thinking_token_budget",
        "a budget needs a reasoning parser (Thinking budget)",
    ),
    Refusal(
        ("grammar", "tools"),
        lambda r: r["grammar"] != "none" and r["tools"] in FORCED_TOOLS,
        "tool_choice",
        "a grammar and a forced tool call (Structured outputs)",
    ),
)


def refusals(row: Mapping[str, str]) -> list[Refusal]:
    """The refusals whose factors `row` fixes and which apply to it."""
    return [
        refusal
        for refusal in REFUSALS
        if all(name in row for name in refusal.factors) and refusal.applies(row)
    ]


def refusal_params(row: Mapping[str, str]) -> set[str]:
    """The `param`s a documented 400 for this row may name; empty when the row is served.

    A request breaking several rules gets the first rule's error, and which one is first
    depends on the route's order of reading, so a cell accepts any of them.
    """
    return {refusal.param for refusal in refusals(row)}


def served(row: Mapping[str, str]) -> bool:
    """Expressible and refused by no rule (as far as `row` is fixed)."""
    return expressible(row) and not refusals(row)


@functools.cache
def pairwise_rows() -> tuple[Row, ...]:
    """The pairwise table: every pair that some served row can hold, in a served row; then
    every other expressible pair, in rows that are refused (they cannot be anything else).
    Grouped by server (in SERVERS order) so each server starts once."""
    served_rows = pairwise(FACTORS, served, seed=SEED)
    servable = required_pairs(FACTORS, served)
    refused_only = required_pairs(FACTORS, expressible) - servable
    refused_rows = pairwise(FACTORS, expressible, seed=SEED, required=refused_only)
    rows = served_rows + refused_rows
    return tuple(sorted(rows, key=lambda row: SERVERS.index(row["server"])))


def full_rows() -> list[Row]:
    rows = list(full_product(FACTORS, expressible))
    return sorted(rows, key=lambda row: SERVERS.index(row["server"]))


def rows_for(mode: str) -> list[Row]:
    """`pairwise` (the table), `full` (the product) or `sample:N` (N seeded picks of the
    product, grouped by server as the others are)."""
    if mode == "pairwise":
        return list(pairwise_rows())
    if mode == "full":
        return full_rows()
    if mode.startswith("sample:"):
        picked = random.Random(SEED).sample(full_rows(), int(mode.removeprefix("sample:")))
        return sorted(picked, key=lambda row: SERVERS.index(row["server"]))
    raise ValueError(f"HELIOS_MATRIX must be pairwise, full or sample:N, not {mode!r}")


def cell_id(index: int, row: Mapping[str, str]) -> str:
    return f"{index:03d}-{row['server']}-{row['api']}"


def markdown(rows: Sequence[Row]) -> str:
    """The table as docs/matrix.md shows it: one line per cell, its expected 400 if refused."""
    names = [factor.name for factor in FACTORS]
    lines = [
        "| cell | " + " | ".join(names) + " | expected |",
        "|---" * (len(names) + 2) + "|",
    ]
    for index, row in enumerate(rows):
        refused = refusal_params(row)
        expected = "400 " + " or ".join(sorted(refused)) if refused else "200"
        cells = [row[name] for name in names]
        lines.append(f"| {index:03d} | " + " | ".join(cells) + f" | {expected} |")
    return "\n".join(lines)


DOC = Path(__file__).resolve().parents[2] / "docs" / "matrix.md"
BEGIN, END = "<!-- matrix table: begin -->", "<!-- matrix table: end -->"


def table_text() -> str:
    rows = pairwise_rows()
    refused = sum(1 for row in rows if refusal_params(row))
    return f"{markdown(rows)}\n\n{len(rows)} cells, {refused} of them documented 400s"


def write_doc() -> None:
    """Replaces the table between docs/matrix.md's markers with the generated one."""
    text = DOC.read_text(encoding="utf-8")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{BEGIN}\n{table_text()}\n{END}{tail}", encoding="utf-8")


def main(argv: list[str]) -> None:
    if "--write-doc" in argv:
        write_doc()
        return
    if "--full" in argv:
        rows = full_rows()
        refused = sum(1 for row in rows if refusal_params(row))
        print(f"full product: {len(rows)} cells, {refused} of them documented 400s")
        return
    print(table_text())


if __name__ == "__main__":
    main(sys.argv[1:])
