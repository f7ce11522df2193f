"""Structured outputs: SmolLM2 tokens/s constrained against unconstrained, compile and mask time.

Run: `.venv/bin/python bench/structured.py [--rounds 5] [--max-tokens 32] [--batch1-prompts 3]`.
One engine in this process on the CPU. The same chat requests for a JSON record run
unconstrained and constrained by a JSON schema (nested objects, arrays, enums, ranges, patterns),
sampled at temperature 0.8 with a seed and greedily: at batch 1 (the first `--batch1-prompts`
one at a time) and batch 8, off and on alternating, median of the paired ratios (target >=
0.9x). Greedy rows skip the sampler's full-vocabulary sort, which is cheaper over masked rows
and so flatters the sampled ratio; the greedy ratio shows the grammar's own cost. Unconstrained
requests ignore EOS and the schema's shortest record is longer than the default 32 tokens, so
both sides generate `max_tokens` per request and run the same steps (the table shows tokens per
request). Then: cold compile time per kind (a fresh spec each time, so the cache never answers),
and the grammar mask time per masked row (one per constrained token) over the constrained runs,
with how much of it the forward did not hide (the executor's wait).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.cli import bootstrap  # noqa: E402
from adapters.gpu.factory import RunnerSettings  # noqa: E402
from adapters.gpu.grammar.lanes import GrammarLanes  # noqa: E402
from adapters.grammar.llguidance_compiler import LlguidanceCompiler  # noqa: E402
from domain.engine.engine import Engine, EngineConfig  # noqa: E402
from domain.requests.engine_request import EngineRequest  # noqa: E402
from domain.requests.sampling import SamplingParams  # noqa: E402
from domain.structured.grammar import GrammarKind, GrammarSpec  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prompts import PERSON_SCHEMA  # noqa: E402

SUBJECTS = [
    "a teacher",
    "a pilot",
    "a chef",
    "a nurse",
    "a farmer",
    "a painter",
    "a judge",
    "a poet",
]


class MaskClock:
    """Times GrammarLanes: the mask jobs (on their worker) and the executor's wait for them."""

    def __init__(self) -> None:
        self.job_s = self.wait_s = 0.0
        self.rows = 0
        masks = GrammarLanes._masks  # noqa: SLF001 - the bench watches the adapter's own work
        start = GrammarLanes.start

        def timed_masks(lanes, *args):
            began = time.perf_counter()
            result = masks(lanes, *args)
            self.job_s += time.perf_counter() - began
            self.rows += int(result.rows.numel())
            return result

        def timed_start(lanes, *args):
            future = start(lanes, *args)
            if future is None:
                return None
            result = future.result
            clock = self

            class _Timed:
                def result(self):
                    began = time.perf_counter()
                    value = result()
                    clock.wait_s += time.perf_counter() - began
                    return value

            return _Timed()

        GrammarLanes._masks = timed_masks  # noqa: SLF001
        GrammarLanes.start = timed_start


def generate(
    engine: Engine,
    prompts,
    grammar: GrammarSpec | None,
    max_tokens: int,
    seed: int,
    temperature: float = 0.8,
):
    """All `prompts` at once, stepped to the end: (generated tokens, seconds)."""
    # Unconstrained text may end early; ignoring EOS keeps its steps those of the constrained run.
    params = [
        SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            seed=seed + i,
            ignore_eos=grammar is None,
        )
        for i in range(len(prompts))
    ]
    channels = [
        engine.submit(
            EngineRequest(f"b{i}-{time.monotonic_ns()}", prompt, params[i], grammar=grammar)
        )
        for i, prompt in enumerate(prompts)
    ]
    start = time.perf_counter()
    while engine.has_work():
        engine.step()
    elapsed = time.perf_counter() - start
    return sum(list(channel)[-1].usage.completion_tokens for channel in channels), elapsed


def measure(engine, prompts, batch, grammar, max_tokens, seed, temperature) -> tuple[float, float]:
    """Tokens per second over `prompts` in groups of `batch`, and tokens per request."""
    tokens, seconds = 0, 0.0
    for start in range(0, len(prompts), batch):
        group = prompts[start : start + batch]
        made, took = generate(engine, group, grammar, max_tokens, seed, temperature)
        tokens, seconds = tokens + made, seconds + took
    return tokens / seconds, tokens / len(prompts)


@dataclass(frozen=True)
class Row:
    """One sampling setting at one batch size: median tok/s off and on, and the paired ratios."""

    temperature: float
    batch: int
    off: float
    on: float
    ratio: float
    ratios: tuple[float, ...]
    off_length: float
    on_length: float


def paired(engine, grammar, temperature: float, batch: int, group, args) -> Row:
    """Off and on in alternating order each round; the ratio is the median of the rounds'."""
    speeds: dict[str, list[float]] = {"off": [], "on": []}
    lengths: dict[str, list[float]] = {"off": [], "on": []}
    ratios = []
    for round_index in range(args.rounds):
        order = ("off", "on") if round_index % 2 == 0 else ("on", "off")
        for name in order:
            spec = grammar if name == "on" else None
            speed, length = measure(
                engine, group, batch, spec, args.max_tokens, 100 * round_index, temperature
            )
            speeds[name].append(speed)
            lengths[name].append(length)
        ratios.append(speeds["on"][-1] / speeds["off"][-1])
        print(
            f"temperature {temperature:g} batch {batch} round {round_index + 1}: "
            f"off {speeds['off'][-1]:.1f}, on {speeds['on'][-1]:.1f} tok/s",
            file=sys.stderr,
            flush=True,
        )
    return Row(
        temperature,
        batch,
        statistics.median(speeds["off"]),
        statistics.median(speeds["on"]),
        statistics.median(ratios),
        tuple(ratios),
        statistics.fmean(lengths["off"]),
        statistics.fmean(lengths["on"]),
    )


def compile_times(tokenizer, rounds: int) -> dict[str, float]:
    """Median cold compile per kind, in ms; every spec is new to the compiler."""
    compiler = LlguidanceCompiler(tokenizer)
    makers = {
        "json_schema": lambda i: GrammarSpec(
            GrammarKind.JSON_SCHEMA, json.dumps({**PERSON_SCHEMA, "title": f"t{i}"})
        ),
        "regex": lambda i: GrammarSpec(
            GrammarKind.REGEX, f"\\(\\d{{3}}\\) \\d{{3}}-\\d{{{4 + i % 3}}}x{i}"
        ),
        "choice": lambda i: GrammarSpec(
            GrammarKind.CHOICE, json.dumps(["positive", "negative", f"n{i}"])
        ),
        "grammar": lambda i: GrammarSpec(
            GrammarKind.GRAMMAR, f'start: "go " NUM\nNUM: /[0-9]{{1,{i + 2}}}/'
        ),
    }
    found = {}
    for kind, make in makers.items():
        times = []
        for i in range(max(rounds, 5)):
            began = time.perf_counter()
            compiler.compile(make(i))
            times.append((time.perf_counter() - began) * 1e3)
        found[kind] = statistics.median(times)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--batch1-prompts", type=int, default=3)
    args = parser.parse_args()

    runner = RunnerSettings(
        device="cpu", max_num_seqs=8, max_model_len=2048, kv_cache_bytes=256 << 20
    )
    loaded = bootstrap.load(None, runner, EngineConfig(max_num_batched_tokens=1024))
    engine, tokenizer = loaded.engine, loaded.tokenizer
    prompts = [
        tuple(
            tokenizer.encode(
                tokenizer.apply_chat_template(
                    [{"role": "user", "content": f"Describe {subject} as a JSON record."}]
                ),
                add_special_tokens=False,
            )
        )
        for subject in SUBJECTS
    ]
    grammar = GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(PERSON_SCHEMA))
    clock = MaskClock()
    # Warm-up of both paths (and the schema's one compile), not counted.
    generate(engine, prompts[:2], grammar, 8, 0)
    generate(engine, prompts[:2], None, 8, 0)
    clock.job_s = clock.wait_s = 0.0
    clock.rows = 0

    rows = [
        paired(engine, grammar, temperature, batch, group, args)
        for temperature in (0.8, 0.0)
        for batch, group in ((1, prompts[: args.batch1_prompts]), (8, prompts))
    ]
    compiles = compile_times(tokenizer, args.rounds)

    print(
        f"# structured outputs: SmolLM2-135M-Instruct float32 CPU, llguidance, "
        f"max {args.max_tokens} tokens, median of {args.rounds} rounds; "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; {_cpu()}"
    )
    print(
        "| sampling | batch | unconstrained tok/s | JSON schema tok/s | ratio (target >= 0.9x) "
        "| round ratios | tokens per request (off / on) |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {'greedy' if row.temperature == 0 else f'T={row.temperature:g}'} | {row.batch} "
            f"| {row.off:.1f} | {row.on:.1f} | {row.ratio:.2f}x "
            f"| {' '.join(f'{r:.2f}' for r in row.ratios)} "
            f"| {row.off_length:.1f} / {row.on_length:.1f} |"
        )
    print("cold compile: " + ", ".join(f"{k} {v:.2f} ms" for k, v in compiles.items()))
    per_row = clock.job_s / max(clock.rows, 1) * 1e6
    print(
        f"mask time: {per_row:.1f} us per masked row (one per constrained token) over "
        f"{clock.rows} rows; the executor waited {clock.wait_s / max(clock.rows, 1) * 1e6:.1f} "
        f"us per row for it ({clock.wait_s / max(clock.job_s, 1e-9):.0%} of the mask time was "
        f"not hidden behind the forward)"
    )


def _cpu() -> str:
    """The CPU's model name and count, as lscpu reports them."""
    try:
        with open("/proc/cpuinfo") as info:
            names = [line.split(":", 1)[1].strip() for line in info if "model name" in line]
    except OSError:
        names = []
    return f"{names[0] if names else 'unknown CPU'}, {os.cpu_count()} CPUs"


if __name__ == "__main__":
    main()
