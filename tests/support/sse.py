"""Reads a server-sent event body into its `data:` payloads."""

from __future__ import annotations

import json


def data_frames(body: str) -> list[str]:
    """The payload of every `data:` frame in order; frames are separated by blank lines."""
    frames = []
    for block in body.split("\n\n"):
        lines = [line for line in block.splitlines() if line.startswith("data:")]
        if lines:
            frames.append("\n".join(line[len("data:") :].strip() for line in lines))
    return frames


def json_frames(body: str) -> list[dict]:
    """All frames before `[DONE]`, parsed; fails if the stream does not end with `[DONE]`."""
    frames = data_frames(body)
    if not frames or frames[-1] != "[DONE]":
        raise AssertionError(f"stream does not end with [DONE]: {frames[-1:]}")
    return [json.loads(frame) for frame in frames[:-1]]


def named_events(body: str) -> list[dict]:
    """A Responses stream's events, parsed, after checking each frame's `event:` names its type."""
    events = []
    for block in body.strip().split("\n\n"):
        name, data = block.split("\n", 1)
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}", (name, event["type"])
        events.append(event)
    return events
