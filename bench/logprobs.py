"""Logprob overhead: server output tokens/s with `top_logprobs=20` against none, same run.

Run: `.venv/bin/python bench/logprobs.py [--url URL] [--requests-per-client K] [--max-tokens M]`.
Without `--url` it starts `helios serve` (the embedded SmolLM2-135M, CPU) on a free port. At each
concurrency (1 and 8) it runs the same greedy chat requests twice, without and with
`logprobs: true, top_logprobs: 20` (the largest natural K), alternating the order per level so
neither variant always runs on a warmer server. Target: with / without >= 0.9x.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import httpx2

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prompts import QUESTIONS  # noqa: E402
from serve import (  # noqa: E402
    add_client_arguments,
    run_bench,
    run_level,
    served_model,
    stream_one,
)

WITH_LOGPROBS = {"logprobs": True, "top_logprobs": 20}


def bench(url: str, levels: list[int], requests_per_client: int, max_tokens: int) -> None:
    with httpx2.Client(timeout=600) as client:
        model = served_model(client, url)
        stream_one(client, url, model, QUESTIONS[0], max_tokens, WITH_LOGPROBS)  # warm-up
    rows = []
    for index, clients in enumerate(levels):
        variants = [None, WITH_LOGPROBS] if index % 2 == 0 else [WITH_LOGPROBS, None]
        measured = {}
        for extra in variants:
            result = run_level(url, model, clients, requests_per_client, max_tokens, extra)
            measured[extra is not None] = result.output_tokens_per_s
        rows.append((clients, measured[False], measured[True]))
    print(
        f"model {model}; {requests_per_client} request(s) per client, {max_tokens} tokens each, "
        "greedy chat, EOS ignored\n"
    )
    print("| clients | no logprobs tok/s | top_logprobs=20 tok/s | ratio |")
    print("|---|---|---|---|")
    for clients, plain, with_logprobs in rows:
        print(f"| {clients} | {plain:.1f} | {with_logprobs:.1f} | {with_logprobs / plain:.2f}x |")
    worst = min(w / p for _, p, w in rows)
    print(f"\nworst ratio with/without logprobs: {worst:.2f}x (target >= 0.9x)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_client_arguments(parser, requests_per_client=3, clients="1,8")
    return run_bench(parser, parser.parse_args(), bench, 2048)


if __name__ == "__main__":
    sys.exit(main())
