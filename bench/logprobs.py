"""Logprob overhead: server output tokens/s with `top_logprobs=20` against none, same run.

Run: `.venv/bin/python bench/logprobs.py [--url URL] [--requests-per-client K] [--max-tokens M]
[--rounds R]`. Without `--url` it starts `helios serve` (the embedded SmolLM2-135M, CPU) on a free
port. At each concurrency (1 and 8) it runs the same greedy chat requests twice, without and with
`logprobs: true, top_logprobs: 20` (the largest natural K), alternating the order per level and
per round so neither variant always runs on a warmer server. With R rounds it prints every
round's pair and the median of the rounds' ratios, with their range: one pair on a shared 2-core
box moves by several percent. Target (issue 21): with / without >= 0.97x at 1 and 8 clients.
"""

from __future__ import annotations

import argparse
import functools
import statistics
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
TARGET = 0.97


def bench(
    url: str, levels: list[int], requests_per_client: int, max_tokens: int, rounds: int = 1
) -> None:
    with httpx2.Client(timeout=600) as client:
        model = served_model(client, url)
        stream_one(client, url, model, QUESTIONS[0], max_tokens, WITH_LOGPROBS)  # warm-up
    rows = []  # (round, clients, without tok/s, with tok/s)
    for round_index in range(rounds):
        for index, clients in enumerate(levels):
            plain_first = (index + round_index) % 2 == 0
            variants = [None, WITH_LOGPROBS] if plain_first else [WITH_LOGPROBS, None]
            measured = {}
            for extra in variants:
                result = run_level(url, model, clients, requests_per_client, max_tokens, extra)
                measured[extra is not None] = result.output_tokens_per_s
            rows.append((round_index + 1, clients, measured[False], measured[True]))
            print(
                f"round {round_index + 1}, N={clients}: {measured[False]:.1f} without, "
                f"{measured[True]:.1f} with logprobs",
                file=sys.stderr,
            )
    print(
        f"model {model}; {requests_per_client} request(s) per client, {max_tokens} tokens each, "
        f"greedy chat, EOS ignored; {rounds} round(s)\n"
    )
    print("| round | clients | no logprobs tok/s | top_logprobs=20 tok/s | ratio |")
    print("|---|---|---|---|---|")
    for round_number, clients, plain, with_logprobs in rows:
        print(
            f"| {round_number} | {clients} | {plain:.1f} | {with_logprobs:.1f} "
            f"| {with_logprobs / plain:.2f}x |"
        )
    print("\n| clients | ratio, median of the rounds (range) |")
    print("|---|---|")
    medians = []
    for clients in levels:
        paired = sorted(w / p for _, n, p, w in rows if n == clients)
        medians.append(statistics.median(paired))
        print(f"| {clients} | {medians[-1]:.2f}x ({paired[0]:.2f}-{paired[-1]:.2f}) |")
    print(f"\nworst median ratio with/without logprobs: {min(medians):.2f}x (target >= {TARGET}x)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_client_arguments(parser, requests_per_client=3, clients="1,8")
    parser.add_argument("--rounds", type=int, default=1, help="pairs per concurrency level")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be positive")
    return run_bench(parser, args, functools.partial(bench, rounds=args.rounds), 2048)


if __name__ == "__main__":
    sys.exit(main())
