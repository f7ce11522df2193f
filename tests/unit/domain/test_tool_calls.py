"""Forced tool calls: the streamed deltas concatenate to the whole calls, in any split."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from domain.structured.tool_calls import ToolCallMode, ToolCallStream, collect_tool_calls

REQUIRED = ToolCallMode((("get_weather", {"type": "object"}), ("now", {"type": "object"})))
NAMED = ToolCallMode(REQUIRED.functions, named="get_weather")
CALLS = [
    {"name": "get_weather", "parameters": {"city": 'Pa"ris, {x}', "days": [1, {"a": 2}]}},
    {"name": "now", "parameters": {}},
]
TEXT = json.dumps(CALLS, ensure_ascii=False)


def streamed(mode: ToolCallMode, text: str, cuts: list[int]) -> list[tuple[str, str]]:
    stream = ToolCallStream(mode)
    calls: dict[int, list[str]] = {}
    edges = [0, *sorted(cuts), len(text)]
    for start, end in zip(edges, edges[1:], strict=False):
        for delta in stream.feed(text[start:end]):
            if delta.id is not None:
                assert delta.index not in calls
                calls[delta.index] = [delta.name or "", ""]
            calls[delta.index][1] += delta.arguments
    return [(name, arguments) for name, arguments in (calls[i] for i in sorted(calls))]


def test_whole_calls_carry_each_parameters_value_as_its_raw_arguments_text():
    calls = collect_tool_calls(REQUIRED, TEXT)

    assert calls is not None
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        (call["name"], call["parameters"]) for call in CALLS
    ]
    assert calls[0].arguments == json.dumps(CALLS[0]["parameters"], ensure_ascii=False)
    assert len({c.id for c in calls}) == 2


@given(st.lists(st.integers(min_value=0, max_value=len(TEXT)), max_size=40))
def test_streamed_calls_concatenate_to_the_whole_calls_wherever_the_text_splits(cuts):
    whole = collect_tool_calls(REQUIRED, TEXT)

    assert whole is not None
    assert streamed(REQUIRED, TEXT, cuts) == [(c.name, c.arguments) for c in whole]


def test_a_named_call_streams_the_whole_text_as_its_arguments():
    text = '{"city": "Oslo"}'

    assert streamed(NAMED, text, [3, 9]) == [("get_weather", text)]
    calls = collect_tool_calls(NAMED, text)
    assert calls is not None and [(c.name, c.arguments) for c in calls] == [("get_weather", text)]


def test_an_output_cut_short_has_no_calls():
    assert collect_tool_calls(REQUIRED, TEXT[:-5]) is None
    assert collect_tool_calls(REQUIRED, "[]") is None
    assert collect_tool_calls(NAMED, '{"city": ') is None
