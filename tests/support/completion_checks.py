"""What every completions `logprobs` object must satisfy, as a client that indexes it reads it."""

from __future__ import annotations

import math
from typing import Any


def check_completion_logprobs(choice: Any, count: int, top_k: int) -> None:
    """`choice` (the openai client's) has `count` entries, each listing its own token first beside
    the `top_k` alternatives (one more when a sampled token is not among them), all finite and
    non-positive, at a text offset where that token's text starts."""
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == count
    for token, value, top, offset in zip(
        logprobs.tokens,
        logprobs.token_logprobs,
        logprobs.top_logprobs,
        logprobs.text_offset,
        strict=True,
    ):
        assert len(top) in (top_k, top_k + 1)
        if len(top) == top_k + 1:
            # Only a sampled token outside the top k adds an entry, and it ranks below them.
            assert all(value <= v for t, v in top.items() if t != token)
        assert next(iter(top)) == token and top[token] == value
        assert all(math.isfinite(v) and v <= 0 for v in top.values())
        # A token holding part of a character renders as U+FFFD, which the text need not show.
        if "\ufffd" not in token:
            assert choice.text[offset:].startswith(token)
