"""The contract's invariants, checked on one cell's answer against what the engine generated and
a float64 reference of the model."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence

import jsonschema
import torch

from tests.matrix.answers import Answer, Choice, Entry
from tests.matrix.requests import CHOICES, FUNCTIONS, REGEX, SCHEMA, SELECTED_IDS
from tests.support.generation_tap import Generation

Rows = Callable[[list[int]], torch.Tensor]
# transformers' FP32 forward and ours sum in different orders: FP32 rounding on the tiny model.
REFERENCE_TOLERANCE = 2e-5
# Two ranks add the split matmuls' summation order (as tests/e2e/test_tensor_parallel_serve.py).
TP_TOLERANCE = 5e-5


def check_entries(
    choice: Choice,
    generation: Generation,
    rows: torch.Tensor,
    row: Mapping[str, str],
    tolerance: float,
) -> None:
    """Each entry is the float64 log_softmax of its position's raw logits, for the chosen token
    and every alternative, and entries come in the order of the tokens they belong to.

    The wire does not say which output position an entry belongs to (forced, reasoning and
    tool-call tokens have none), so each entry is matched to the next position holding its
    token with its value; an entry no later position explains fails the cell."""
    prompt, tokens = list(generation.prompt), generation.tokens[choice.index]
    for position, entry in enumerate(choice.prompt_entries):
        if position == 0:
            assert entry is None, "the first prompt position has a null entry"
            continue
        assert entry is not None and entry.token_id == prompt[position], (position, entry)
        _check_entry(entry, rows[position - 1], row, tolerance, natural_only=True)
    cursor = 0
    for number, entry in enumerate(choice.entries):
        found = next(
            (
                j
                for j in range(cursor, len(tokens))
                if tokens[j] == entry.token_id
                and abs(rows[len(prompt) - 1 + j][entry.token_id].item() - entry.logprob)
                <= tolerance
            ),
            None,
        )
        assert found is not None, (
            f"choice {choice.index} entry {number} (token {entry.token_id}, {entry.logprob}) "
            f"equals no later output position's log_softmax; output {tokens}, from {cursor}"
        )
        _check_entry(entry, rows[len(prompt) - 1 + found], row, tolerance)
        cursor = found + 1


def _check_entry(
    entry: Entry,
    reference: torch.Tensor,
    row: Mapping[str, str],
    tolerance: float,
    natural_only: bool = False,
) -> None:
    assert math.isfinite(entry.logprob) and entry.logprob <= 0
    for token, value in entry.top:
        assert abs(reference[token].item() - value) <= tolerance, (token, value)
    listed = [token for token, _ in entry.top]
    count = int(row["logprobs"])
    if entry.offset is not None:
        # Completions list the chosen token first, then the alternatives (a shared key once).
        assert listed and listed[0] == entry.token_id, listed
        if row["token_ids"] == "ids" and not natural_only:
            assert listed[1:] == [t for t in SELECTED_IDS if t != entry.token_id], listed
            return
        natural = listed[1:] if len(listed) == count + 1 else listed
        assert len(natural) == count, (listed, count)
    elif row["token_ids"] == "ids":
        assert listed == SELECTED_IDS, listed
        return
    else:
        natural = listed
        assert len(natural) == count, (listed, count)
        values = [value for _, value in entry.top]
        assert values == sorted(values, reverse=True), values
    if count:
        kth = torch.topk(reference, count).values[-1].item()
        assert all(reference[t].item() >= kth - tolerance for t in natural), natural


def check_prompt_logprobs(
    listed: Sequence | None, prompt: Sequence[int], rows: torch.Tensor, count: int, tolerance: float
) -> None:
    """vLLM's `prompt_logprobs`: null first, then the prompt token and the top `count`, keyed by
    token ID, each the float64 log_softmax of the previous position's logits."""
    assert listed is not None and len(listed) == len(prompt), "one entry per prompt token"
    assert listed[0] is None
    for position, found in enumerate(listed[1:], start=1):
        assert str(prompt[position]) in found, (position, found)
        assert len(found) in (count, count + 1), found
        for key, value in found.items():
            expected = rows[position - 1][int(key)].item()
            assert abs(value["logprob"] - expected) <= tolerance, (position, key)
            greater = int((rows[position - 1] > expected).sum())
            assert value["rank"] in (greater + 1, greater, greater + 2), (position, key)


def check_completion_text(choice: Choice, prompt_text: str, echo: bool, decode) -> None:
    """Each entry's token text (as the text shows it: special tokens have none) starts at its
    offset; an echo's text starts with the prompt."""
    for entry in [*choice.prompt_entries, *choice.entries]:
        if entry is None:
            continue
        text = decode([entry.token_id])
        assert entry.offset is not None
        if "\ufffd" not in text and entry.offset < len(choice.text):
            assert choice.text[entry.offset :].startswith(text), (entry, choice.text)
    if echo:
        assert choice.text.startswith(prompt_text)


def check_content_bytes(choice: Choice) -> None:
    """Chat and Responses entries' `bytes` concatenate to the content they cover: all of it, and
    beyond it only whitespace a parser stripped."""
    joined = b"".join(entry.raw or b"" for entry in choice.entries)
    content = choice.text.encode()
    if not choice.entries:
        assert not choice.text.strip(), f"content {choice.text!r} has no entries"
        return
    if b"\xef\xbf\xbd" in content:
        return  # the replacement character stands for bytes the content does not hold
    start = joined.find(content)
    assert start >= 0, (joined, content)
    assert not joined[:start].strip() and not joined[start + len(content) :].strip(), (
        joined,
        content,
    )


def check_grammar(row: Mapping[str, str], text: str) -> None:
    """A grammar output that ended by completing is one the grammar accepts."""
    if row["grammar"] == "json_schema":
        jsonschema.validate(json.loads(text), SCHEMA)
    elif row["grammar"] == "regex":
        assert re.fullmatch(REGEX, text), repr(text)
    elif row["grammar"] == "choice":
        assert text in CHOICES, repr(text)


def check_tool_calls(row: Mapping[str, str], choice: Choice) -> None:
    assert choice.tool_calls, f"a forced call ended as {choice.finish_reason} without calls"
    for name, arguments in choice.tool_calls:
        if row["tools"] == "named":
            assert name == "get_weather", name
        assert name in FUNCTIONS, name
        jsonschema.validate(json.loads(arguments), FUNCTIONS[name])


def check_thinking(tokens: Sequence[int], start: int, end: int, budget: int) -> None:
    """The prompt opened a block: the end is forced at the budget unless the model closed it
    first, and every block closes once."""
    if len(tokens) > budget and end not in tokens[:budget]:
        assert tokens[budget] == end, f"no forced end at {budget}: {tokens}"
    opened = 1 + sum(1 for t in tokens if t == start)
    assert sum(1 for t in tokens if t == end) <= opened, f"an end forced twice: {tokens}"
    if end in tokens:
        first = tokens.index(end)
        assert tokens[first + 1 : first + 2] != [end], f"the end twice in a row: {tokens}"


def check_entry_count(choice: Choice, tokens: Sequence[int], prompt_len: int) -> None:
    """Every generated token has an entry but a terminating one (EOS, which ends a `stop` or
    `tool_calls` choice); echo gives the prompt one each and keeps the terminating token's."""
    if choice.prompt_entries:
        assert len(choice.prompt_entries) == prompt_len
        assert len(choice.entries) == len(tokens), (len(choice.entries), tokens)
        return
    terminated = choice.finish_reason in ("stop", "tool_calls")
    assert len(choice.entries) == len(tokens) - terminated, (len(choice.entries), tokens)


def check_refusal(status: int, payload: dict, params: set[str]) -> None:
    assert status == 400, (status, payload)
    error = payload["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400, error
    assert error["param"] in params, (error, params)


def same_answer(a: Answer, b: Answer) -> None:
    """Every choice the same: text, reasoning, entries with their values, finish and calls."""
    assert sorted(a.choices) == sorted(b.choices)
    for index in a.choices:
        assert a.choices[index] == b.choices[index], index
