"""Speculative decoding: SmolLM2 tokens/s with n-gram speculation (k = 4) against none.

Run: `.venv/bin/python bench/speculative.py [--rounds 3] [--max-tokens 128]`.
Both engines run in this process on the CPU with `logprobs: 20` on every request, greedy, EOS
allowed (speculation does not change a greedy output, so both produce the same tokens). Two
workloads: copy-heavy (rewrite and edit requests whose answer repeats their input) and
open-ended (the shared chat questions). Each is measured at batch 1 (one request at a time)
and batch 8, spec off and on alternating, median of the rounds. Targets: copy-heavy batch 1
>= 1.8x, copy-heavy batch 8 >= 1.2x, open-ended >= 0.95x.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.cli import bootstrap  # noqa: E402
from adapters.gpu.factory import RunnerSettings  # noqa: E402
from domain.engine.engine import Engine, EngineConfig  # noqa: E402
from domain.logprobs.rules import LogprobAsk  # noqa: E402
from domain.requests.engine_request import EngineRequest  # noqa: E402
from domain.requests.sampling import SamplingParams  # noqa: E402
from domain.speculation.drafts import SpeculativeConfig  # noqa: E402
from domain.telemetry.step_stats import StepStats  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prompts import QUESTIONS  # noqa: E402

NGRAM = (
    '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,'
    ' "prompt_lookup_max": 4}'
)
PASSAGES = [
    "The library opens at nine in the morning and closes at six in the evening. Members may "
    "borrow up to five books at a time, and each loan lasts three weeks.",
    "Our team meets every Monday to review the week's goals. Please bring your notes, your "
    "questions and any blockers you want to discuss with the group.",
    "To reset your password, open the settings page, choose security, and follow the link we "
    "send to your email address. The link expires after one hour.",
    "The train to the coast leaves from platform four at half past ten. Tickets can be bought "
    "at the station or online, and children under five travel free.",
]
COPY_TASKS = [
    "Repeat the following text exactly, word for word:\n\n{}",
    "Rewrite the following text, keeping every sentence but fixing any mistakes:\n\n{}",
    "Copy this paragraph and replace the word 'and' with '&':\n\n{}",
    "Quote this notice back to me verbatim:\n\n{}",
]


class Acceptance:
    """An engine observer that adds up the speculation counts."""

    def __init__(self) -> None:
        self.rounds = self.offered = self.accepted = 0

    def record_step(self, stats: StepStats) -> None:
        self.rounds += stats.spec_drafts
        self.offered += stats.spec_draft_tokens
        self.accepted += stats.spec_accepted_tokens


@dataclass(frozen=True)
class Measurement:
    tokens_per_s: float
    tokens: int


def chat(tokenizer, text: str) -> tuple[int, ...]:
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}])
    return tuple(tokenizer.encode(rendered, add_special_tokens=False))


def generate(engine: Engine, prompts: list[tuple[int, ...]], max_tokens: int) -> Measurement:
    """All `prompts` submitted at once, stepped to the end; generated tokens per second."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    ask = LogprobAsk(wanted=True, count=20)
    channels = [
        engine.submit(EngineRequest(f"b{i}-{time.monotonic_ns()}", p, params, logprobs=ask))
        for i, p in enumerate(prompts)
    ]
    start = time.perf_counter()
    while engine.has_work():
        engine.step()
    elapsed = time.perf_counter() - start
    tokens = sum(list(channel)[-1].usage.completion_tokens for channel in channels)
    return Measurement(tokens / elapsed, tokens)


def measure(engine: Engine, prompts: list[tuple[int, ...]], batch: int, max_tokens: int):
    """Tokens/s over `prompts`, `batch` at a time (batch 1: summed time of single requests)."""
    tokens, seconds = 0, 0.0
    for start in range(0, len(prompts), batch):
        result = generate(engine, prompts[start : start + batch], max_tokens)
        tokens += result.tokens
        seconds += result.tokens / result.tokens_per_s
    return Measurement(tokens / seconds, tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()

    runner = RunnerSettings(
        device="cpu", max_num_seqs=8, max_model_len=2048, kv_cache_bytes=256 << 20
    )
    acceptance = Acceptance()
    engines = {
        "off": bootstrap.load(None, runner, EngineConfig(max_num_batched_tokens=1024)).engine,
        "ngram": bootstrap.load(
            None,
            runner,
            EngineConfig(
                max_num_batched_tokens=1024, speculative=SpeculativeConfig.from_json(NGRAM)
            ),
            observer=acceptance,
        ).engine,
    }
    tokenizer = bootstrap.load(None, runner, EngineConfig()).tokenizer
    workloads = {
        "copy-heavy": [
            chat(tokenizer, task.format(passage)) for task in COPY_TASKS for passage in PASSAGES
        ][:8],
        "open-ended": [chat(tokenizer, question) for question in QUESTIONS[:8]],
    }
    for engine in engines.values():
        generate(engine, workloads["open-ended"][:1], 8)  # warm-up

    rows = []
    for workload, prompts in workloads.items():
        for batch in (1, 8):
            speeds: dict[str, list[float]] = {"off": [], "ngram": []}
            ratios = []
            before = (acceptance.rounds, acceptance.offered, acceptance.accepted)
            for round_index in range(args.rounds):
                order = ("off", "ngram") if round_index % 2 == 0 else ("ngram", "off")
                for name in order:
                    speeds[name].append(
                        measure(engines[name], prompts, batch, args.max_tokens).tokens_per_s
                    )
                # Paired: each round's ratio comes from back-to-back runs, so the machine's
                # drift between rounds cancels out.
                ratios.append(speeds["ngram"][-1] / speeds["off"][-1])
            rounds = acceptance.rounds - before[0]
            offered = acceptance.offered - before[1]
            accepted = acceptance.accepted - before[2]
            off, on = statistics.median(speeds["off"]), statistics.median(speeds["ngram"])
            rows.append(
                (
                    workload,
                    batch,
                    off,
                    on,
                    statistics.median(ratios),
                    accepted / max(offered, 1),
                    1 + accepted / max(rounds, 1),
                )
            )

    print(
        f"# speculative decoding: SmolLM2-135M-Instruct float32 CPU, n-gram k=4 (lookup 2..4), "
        f"logprobs 20, greedy, max {args.max_tokens} tokens, median of {args.rounds}; "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}"
    )
    print(
        "| workload | batch | spec off tok/s | n-gram tok/s | ratio | acceptance "
        "| mean accepted length |"
    )
    print("|---|---|---|---|---|---|---|")
    for workload, batch, off, on, ratio, rate, length in rows:
        print(
            f"| {workload} | {batch} | {off:.1f} | {on:.1f} | {ratio:.2f}x | {rate:.0%} "
            f"| {length:.2f} |"
        )


if __name__ == "__main__":
    main()
