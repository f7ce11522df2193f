"""Tensor parallelism on the CPU: SmolLM2 tokens/s on two gloo ranks against one rank.

Run: `.venv/bin/python bench/tensor_parallel.py [--rounds 3] [--max-tokens 32]`.
One rank is an in-process engine, measured on every core (the baseline) and on one thread (what
each rank of two has); two ranks are this process as rank 0
(`adapters.gpu.distributed.launch.start_world`, as `helios serve -tp 2` starts them) and a spawned
peer, each with half the cores. Every request is a chat question, greedy, EOS ignored, with
`logprobs: 5`. Batch 1 runs 4 requests one at a time, batch 8 runs 8 together; the three run
back to back in a rotating order each round, and each ratio is the median of the rounds' paired
ratios. Rank 0's exchange tally gives the bytes it sends per generated token, by purpose, in the
decode steps (after each batch's first step, which prefills), and the pickled plans it
broadcasts on the control group. The CPU time of other processes during the run is reported:
on a shared machine it moves every number.
"""

from __future__ import annotations

import argparse
import os
import pickle
import platform
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.core.export import CoreSizes, resolve_core  # noqa: E402
from adapters.gpu.distributed.launch import ParallelLaunch, World, start_world  # noqa: E402
from adapters.gpu.distributed.split import split_model  # noqa: E402
from adapters.gpu.factory import ExecutorRecipe, RunnerSettings  # noqa: E402
from adapters.gpu.model.config import ModelConfig  # noqa: E402
from adapters.tokenizer.hf import HfTokenizer  # noqa: E402
from domain.emission.outputs import ChoiceDelta  # noqa: E402
from domain.engine.engine import Engine, EngineConfig  # noqa: E402
from domain.logprobs.rules import LogprobAsk  # noqa: E402
from domain.requests.engine_request import EngineRequest  # noqa: E402
from domain.requests.sampling import SamplingParams  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prompts import QUESTIONS  # noqa: E402

BATCH_ONE_REQUESTS = 4
PLAN = "plan (control)"
EXCHANGES = "exchanges"


class PlanBytes:
    """Wraps rank 0's submit: adds up the pickled size of every plan it broadcasts."""

    def __init__(self, world: World) -> None:
        self.bytes = 0
        submit = world.executor.submit

        def counting(plan):
            self.bytes += len(pickle.dumps(plan)) + 8  # the payload and its int64 length
            return submit(plan)

        world.executor.submit = counting  # type: ignore[method-assign]


@dataclass
class Contender:
    """One side of the comparison: its engine, its CPU threads, and (two ranks) its world."""

    engine: Engine
    threads: int
    world: World | None = None
    plans: PlanBytes | None = None

    def sent(self) -> Counter[str]:
        """Bytes rank 0 has sent so far, by purpose, and (under "exchanges") how many
        collectives it joined."""
        if self.world is None:
            return Counter()
        tally = self.world.executor.collectives.tally
        found = Counter({purpose: 4 * count for purpose, count in tally.words.items()})
        found[PLAN] = self.plans.bytes if self.plans else 0
        found[EXCHANGES] = sum(tally.calls.values())
        return found


@dataclass
class Run:
    seconds: float
    tokens: int
    decode_tokens: int
    decode_steps: int
    decode_seconds: float
    decode_bytes: Counter[str]
    outputs: list[tuple[int, ...]]


def chat(tokenizer: HfTokenizer, text: str) -> tuple[int, ...]:
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}])
    return tuple(tokenizer.encode(rendered, add_special_tokens=False))


def generate(
    contender: Contender,
    prompts: list[tuple[int, ...]],
    max_tokens: int,
    params: SamplingParams | None = None,
) -> Run:
    """All `prompts` at once, stepped to the end (greedy unless `params` say otherwise): wall
    time, tokens, and the bytes sent in the decode steps (every step after the first)."""
    torch.set_num_threads(contender.threads)
    engine = contender.engine
    if params is None:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    ask = LogprobAsk(wanted=True, count=5)
    channels = [
        engine.submit(EngineRequest(f"r{i}-{time.monotonic_ns()}", p, params, logprobs=ask))
        for i, p in enumerate(prompts)
    ]
    start = time.perf_counter()
    engine.step()
    after_prefill = contender.sent()
    decode_start = time.perf_counter()
    steps = 0
    while engine.has_work():
        engine.step()
        steps += 1
    end = time.perf_counter()
    seconds, decode_seconds = end - start, end - decode_start
    decode_bytes = contender.sent()
    decode_bytes.subtract(after_prefill)
    outputs = []
    for channel in channels:
        tokens: list[int] = []
        while (item := channel.get_nowait()) is not None:
            if isinstance(item, ChoiceDelta):
                tokens += item.token_ids
        outputs.append(tuple(tokens))
    generated = sum(len(tokens) for tokens in outputs)
    return Run(
        seconds, generated, generated - len(prompts), steps, decode_seconds, decode_bytes, outputs
    )


def measure(contender: Contender, prompts, batch: int, max_tokens: int) -> Run:
    """`prompts`, `batch` at a time (batch 1: the summed time of single requests)."""
    runs = [
        generate(contender, prompts[start : start + batch], max_tokens)
        for start in range(0, len(prompts), batch)
    ]
    decode_bytes: Counter[str] = Counter()
    for run in runs:
        decode_bytes.update(run.decode_bytes)
    return Run(
        sum(run.seconds for run in runs),
        sum(run.tokens for run in runs),
        sum(run.decode_tokens for run in runs),
        sum(run.decode_steps for run in runs),
        sum(run.decode_seconds for run in runs),
        decode_bytes,
        [output for run in runs for output in run.outputs],
    )


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def busy_seconds() -> float:
    """CPU seconds every core of the machine has spent busy since boot."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def process_seconds(pid: int) -> float:
    """CPU seconds process `pid` has used (user and system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# Sampling settings whose top-k/top-p cutoff the 256 exchanged candidates may not settle.
TRUNCATIONS = {
    "top_p 0.9, T 0.8": dict(temperature=0.8, top_p=0.9),
    "top_p 0.95, T 1.0": dict(temperature=1.0, top_p=0.95),
    "top_p 0.99, T 1.5": dict(temperature=1.5, top_p=0.99),
    "top_k 50, top_p 0.95, T 0.7": dict(temperature=0.7, top_k=50, top_p=0.95),
    "top_k 1000, T 1.0": dict(temperature=1.0, top_k=1000),
}


def gathered_rows(contender: Contender, prompts, max_tokens: int, widest: int) -> list[tuple]:
    """Per truncation setting: rows sampled, and rows whose cutoff needed their gathered logits
    (the counted fallback), from rank 0's tally of the "sampling rows gathered" words."""
    found = []
    for name, settings in TRUNCATIONS.items():
        before = contender.sent()["sampling rows gathered"]
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, seed=7, **settings)
        run = generate(contender, prompts, max_tokens, params)
        words = (contender.sent()["sampling rows gathered"] - before) // 4
        found.append((name, run.tokens, words // widest))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument(
        "--fallback-only",
        action="store_true",
        help="measure only how often top-k/top-p rows gather their logits (no speed rounds)",
    )
    args = parser.parse_args()

    cores = os.cpu_count() or 1
    runner = RunnerSettings(
        device="cpu", max_num_seqs=8, max_model_len=1024, kv_cache_bytes=128 << 20
    )
    core = resolve_core(None, CoreSizes(runner.max_num_seqs))
    tokenizer = HfTokenizer.from_dir(core.model_dir)
    recipe = ExecutorRecipe(
        core.model_dir,
        replace(runner, tensor_parallel_size=2),
        tokenizer.vocab_size,
        capability=core.capability,
        capacity=core.capacity,
        token_capacity=core.token_capacity,
    )
    config = EngineConfig(max_num_seqs=8, max_num_batched_tokens=512)
    one_rank = Engine(replace(recipe, settings=runner).build(), tokenizer, config)
    loading = time.perf_counter()
    world = start_world(recipe, ParallelLaunch(local_ranks=2, timeout_s=120))
    load_seconds = time.perf_counter() - loading
    # One rank on every core (the baseline), one rank on one core (what each TP2 rank has), two.
    contenders = {
        "tp1": Contender(one_rank, threads=cores),
        "tp1-1t": Contender(one_rank, threads=1),
        "tp2": Contender(
            Engine(world.executor, tokenizer, config),
            threads=max(1, cores // 2),
            world=world,
            plans=PlanBytes(world),
        ),
    }
    names = list(contenders)
    peer = world.peers[0].pid
    prompts = [chat(tokenizer, question) for question in QUESTIONS[:8]]
    splits = split_model(ModelConfig.from_dir(core.model_dir), 2, tokenizer.vocab_size)
    widest = max(stop - start for start, stop in (split.vocab for split in splits))
    if args.fallback_only:
        try:
            fallback = gathered_rows(contenders["tp2"], prompts, args.max_tokens, widest)
        finally:
            world.close()
        print_fallback(fallback, len(prompts), args.max_tokens)
        return
    try:
        for contender in contenders.values():
            generate(contender, prompts[:1], 8)  # warm-up
        busy, ours = busy_seconds(), process_seconds(os.getpid()) + process_seconds(peer)
        wall = time.perf_counter()
        rows = []
        decode_bytes: dict[int, Counter[str]] = {}
        decode_tokens: dict[int, int] = {}
        decode_steps: dict[int, int] = {}
        same = total = 0
        for batch in (1, 8):
            workload = prompts[:BATCH_ONE_REQUESTS] if batch == 1 else prompts
            speeds: dict[str, list[float]] = {name: [] for name in names}
            step_ms: dict[str, list[float]] = {name: [] for name in names}
            ratios: dict[str, list[float]] = {"tp1": [], "tp1-1t": []}
            decode_bytes[batch], decode_tokens[batch], decode_steps[batch] = Counter(), 0, 0
            for round_index in range(args.rounds):
                # Each round rotates the order; its ratios come from back-to-back runs.
                order = names[round_index % 3 :] + names[: round_index % 3]
                runs = {}
                for name in order:
                    run = measure(contenders[name], workload, batch, args.max_tokens)
                    runs[name] = run
                    speeds[name].append(run.tokens / run.seconds)
                    step_ms[name].append(1000 * run.decode_seconds / max(run.decode_steps, 1))
                for baseline in ratios:
                    ratios[baseline].append(speeds["tp2"][-1] / speeds[baseline][-1])
                decode_bytes[batch].update(runs["tp2"].decode_bytes)
                decode_tokens[batch] += runs["tp2"].decode_tokens
                decode_steps[batch] += runs["tp2"].decode_steps
                for a, b in zip(runs["tp1"].outputs, runs["tp2"].outputs, strict=True):
                    same += a == b
                    total += 1
            rows.append(
                (
                    batch,
                    {name: statistics.median(values) for name, values in speeds.items()},
                    {name: statistics.median(values) for name, values in step_ms.items()},
                    {name: statistics.median(values) for name, values in ratios.items()},
                    {name: (min(values), max(values)) for name, values in ratios.items()},
                )
            )
        wall = time.perf_counter() - wall
        others = (
            busy_seconds() - busy - (process_seconds(os.getpid()) + process_seconds(peer) - ours)
        )
        fallback = gathered_rows(contenders["tp2"], prompts, args.max_tokens, widest)
    finally:
        world.close()

    print(
        f"# tensor parallelism: SmolLM2-135M-Instruct float32 CPU (gloo over loopback), greedy, "
        f"logprobs 5, {args.max_tokens} tokens a request, EOS ignored, median of {args.rounds} "
        f"rounds; torch {torch.__version__}, {cores} cores ({cpu_model()}); TP2 world started "
        f"in {load_seconds:.1f} s; greedy outputs TP1 = TP2: {same}/{total}; other processes "
        f"used {others / wall:.2f} of the {cores} cores during the {wall:.0f} s measured"
    )
    print(
        f"| batch | TP1 ({cores} threads) tok/s | TP1 (1 thread) tok/s | TP2 (1 thread a rank) "
        f"tok/s | TP2/TP1 | TP2/TP1 (1 thread) | decode ms a step: TP1 / TP1 1t / TP2 |"
    )
    print("|---|---|---|---|---|---|---|")
    for batch, speed, step, ratio, spread in rows:
        print(
            f"| {batch} | {speed['tp1']:.1f} | {speed['tp1-1t']:.1f} | {speed['tp2']:.1f} "
            f"| {ratio['tp1']:.2f}x ({spread['tp1'][0]:.2f}-{spread['tp1'][1]:.2f}) "
            f"| {ratio['tp1-1t']:.2f}x ({spread['tp1-1t'][0]:.2f}-{spread['tp1-1t'][1]:.2f}) "
            f"| {step['tp1']:.0f} / {step['tp1-1t']:.0f} / {step['tp2']:.0f} |"
        )
    purposes = sorted(
        {p for counts in decode_bytes.values() for p, b in counts.items() if b > 0} - {EXCHANGES}
    )
    print()
    print("TP2, rank 0's bytes sent per generated token in decode steps, by purpose:")
    print("| batch | " + " | ".join(purposes) + " | total | exchanges a step |")
    print("|---|" + "---|" * (len(purposes) + 2))
    for batch, counts in decode_bytes.items():
        per_token = [counts[p] / max(decode_tokens[batch], 1) for p in purposes]
        cells = " | ".join(f"{value:,.0f}" for value in per_token)
        exchanges = counts[EXCHANGES] / max(decode_steps[batch], 1)
        print(f"| {batch} | {cells} | {sum(per_token):,.0f} | {exchanges:.0f} |")
    print_fallback(fallback, len(prompts), args.max_tokens)


def print_fallback(fallback: list[tuple], requests: int, max_tokens: int) -> None:
    print()
    print(
        f"TP2 top-k/top-p rows settled by gathering their logits ({requests} chat requests "
        f"together, {max_tokens} tokens each, seed 7):"
    )
    print("| sampling | rows sampled | rows gathered | share |")
    print("|---|---|---|---|")
    for name, sampled, gathered in fallback:
        print(f"| {name} | {sampled} | {gathered} | {gathered / max(sampled, 1):.1%} |")


if __name__ == "__main__":
    main()
