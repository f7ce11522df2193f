"""Batch-invariant mode: SmolLM2 tokens/s with `--batch-invariant` against the default kernels.

Run: `.venv/bin/python bench/invariant.py [--rounds 3] [--max-tokens 64]`.
Both engines run in this process on the CPU with `logprobs: 20` on every request, greedy,
the 16 shared chat questions. Batch 1 runs the questions one at a time (summed time), batch 16
all at once; default and invariant alternate within each round, and each round's ratio comes
from back-to-back runs. Prints a markdown table and the ratios (issue 22's target: >= 0.8x).
Also reports whether the invariant engine's batch-16 tokens and logprobs equal its batch-1 ones
bit for bit, and how many entries differ in the default mode.
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
from domain.emission.outputs import ChoiceDelta  # noqa: E402
from domain.engine.engine import Engine, EngineConfig  # noqa: E402
from domain.logprobs.rules import LogprobAsk  # noqa: E402
from domain.requests.engine_request import EngineRequest  # noqa: E402
from domain.requests.sampling import SamplingParams  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prompts import QUESTIONS  # noqa: E402

MODES = ("default", "invariant")


@dataclass(frozen=True)
class Measurement:
    tokens: int
    seconds: float
    entries: dict[str, list[str]]  # per request: exact reprs of its tokens and logprob entries


def generate(engine: Engine, prompts: list[tuple[int, ...]], max_tokens: int) -> Measurement:
    """All `prompts` submitted at once and stepped to the end."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    ask = LogprobAsk(wanted=True, count=20)
    stamp = time.monotonic_ns()
    channels = {
        prompt: engine.submit(EngineRequest(f"b{i}-{stamp}", prompt, params, logprobs=ask))
        for i, prompt in enumerate(prompts)
    }
    start = time.perf_counter()
    while engine.has_work():
        engine.step()
    elapsed = time.perf_counter() - start
    tokens, entries = 0, {}
    for index, channel in enumerate(channels.values()):
        items = list(channel)
        tokens += items[-1].usage.completion_tokens
        entries[f"q{index}"] = [
            repr(entry.position)
            for item in items
            if isinstance(item, ChoiceDelta)
            for entry in item.logprobs
        ]
    return Measurement(tokens, elapsed, entries)


def measure(engine: Engine, prompts: list[tuple[int, ...]], batch: int, max_tokens: int):
    """`prompts` `batch` at a time; batch 1 sums the single requests' times."""
    tokens, seconds, entries = 0, 0.0, {}
    for start in range(0, len(prompts), batch):
        result = generate(engine, prompts[start : start + batch], max_tokens)
        tokens += result.tokens
        seconds += result.seconds
        entries.update({f"q{start + int(k[1:])}": v for k, v in result.entries.items()})
    return Measurement(tokens, seconds, entries)


def differing(first: dict[str, list[str]], second: dict[str, list[str]]) -> tuple[int, int]:
    """(entries whose bits differ, entries compared)."""
    differ = compared = 0
    for name, entries in first.items():
        for a, b in zip(entries, second[name], strict=False):
            compared += 1
            differ += a != b
    return differ, compared


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()

    engines = {}
    loaded = None
    for mode in MODES:
        runner = RunnerSettings(
            device="cpu",
            max_num_seqs=16,
            max_model_len=2048,
            kv_cache_bytes=256 << 20,
            batch_invariant=mode == "invariant",
        )
        loaded = bootstrap.load(None, runner, EngineConfig(max_num_batched_tokens=1024))
        engines[mode] = loaded.engine
    assert loaded is not None
    tokenizer = loaded.tokenizer
    prompts = []
    for question in QUESTIONS:
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": question}])
        prompts.append(tuple(tokenizer.encode(rendered, add_special_tokens=False)))
    for engine in engines.values():
        generate(engine, prompts[:2], 8)  # warm-up

    rows = []
    last: dict[tuple[str, int], Measurement] = {}
    for batch in (1, 16):
        speeds: dict[str, list[float]] = {mode: [] for mode in MODES}
        ratios = []
        for round_index in range(args.rounds):
            order = MODES if round_index % 2 == 0 else MODES[::-1]
            for mode in order:
                result = measure(engines[mode], prompts, batch, args.max_tokens)
                speeds[mode].append(result.tokens / result.seconds)
                last[mode, batch] = result
            ratios.append(speeds["invariant"][-1] / speeds["default"][-1])
        rows.append(
            (
                batch,
                statistics.median(speeds["default"]),
                statistics.median(speeds["invariant"]),
                statistics.median(ratios),
            )
        )

    print(
        f"# batch-invariant mode: SmolLM2-135M-Instruct float32 CPU, {len(prompts)} chat "
        f"questions, logprobs 20, greedy, max {args.max_tokens} tokens, median of "
        f"{args.rounds}; torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}"
    )
    print("| batch | default tok/s | batch-invariant tok/s | ratio |")
    print("|---|---|---|---|")
    for batch, default, invariant, ratio in rows:
        print(f"| {batch} | {default:.1f} | {invariant:.1f} | {ratio:.2f}x |")
    for mode in MODES:
        differ, compared = differing(last[mode, 1].entries, last[mode, 16].entries)
        print(f"{mode}: batch 16 vs batch 1, {differ} of {compared} logprob entries differ")


if __name__ == "__main__":
    main()
