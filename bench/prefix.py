"""Prefix caching: SmolLM2 time to first token on a hit against a miss, and tokens/s with the
cache on and off on a multi-turn workload and on one that shares nothing.

Run: `.venv/bin/python bench/prefix.py [--system-tokens 1000] [--conversations 4] [--turns 3]
[--new-tokens 16]`.

In this one process, float32 on the CPU, greedy, EOS ignored. Time to first token: a request
with a `--system-tokens` system prompt and a question, alone, on a fresh engine (a miss), then
the same system prompt with another question (a hit), each the median of 3. Multi-turn: each
of `--conversations` chats runs `--turns` turns, each turn's prompt the system prompt, the
earlier turns and their answers (the answer's tokens as generated), all conversations' turn k
submitted together. No sharing: the same turns, each prompt replaced by a fresh one of its
length that shares no block with any other. Hit rate: prefix-cache hits over queries
(tokens), from the engine's counters, over the time-to-first-token and multi-turn runs.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.cli import bootstrap  # noqa: E402
from adapters.gpu.factory import RunnerSettings  # noqa: E402
from domain.emission.outputs import ChoiceDelta, RequestEnd  # noqa: E402
from domain.engine.engine import EngineConfig  # noqa: E402
from domain.requests.engine_request import EngineRequest  # noqa: E402
from domain.requests.sampling import SamplingParams  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prompts import QUESTIONS  # noqa: E402

_ids = iter(range(1 << 30))


class Counts:
    """An engine observer that sums the prefix cache's counters."""

    def __init__(self) -> None:
        self.queries = self.hits = 0

    def record_step(self, stats) -> None:
        self.queries += stats.prefix_cache_queries
        self.hits += stats.prefix_cache_hits


def load(caching: bool, observer: Counts):
    return bootstrap.load(
        None,
        RunnerSettings(max_num_seqs=16, max_model_len=2048, kv_cache_bytes=1 << 30),
        EngineConfig(max_num_batched_tokens=1024, prefix_caching="sha256" if caching else None),
        observer=observer,
    )


def system_prompt(tokenizer, count: int, salt: int = 0) -> tuple[int, ...]:
    words = " ".join(f"rule {salt}.{i}: answer briefly and politely." for i in range(count))
    return tuple(tokenizer.encode(words, add_special_tokens=False))[:count]


def run(engine, prompts: list[tuple[int, ...]], new_tokens: int) -> tuple[float, list, float]:
    """(seconds, each prompt's generated tokens, seconds to the first request's first token)."""
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    channels = [engine.submit(EngineRequest(f"p{next(_ids)}", p, params)) for p in prompts]
    outputs: list[list[int]] = [[] for _ in prompts]
    first = None
    start = time.perf_counter()
    while engine.has_work():
        engine.step()
        for index, channel in enumerate(channels):
            while (item := channel.get_nowait()) is not None:
                if isinstance(item, ChoiceDelta):
                    outputs[index] += item.token_ids
                    if first is None and item.token_ids and index == 0:
                        first = time.perf_counter() - start
                elif isinstance(item, RequestEnd):
                    assert item.error is None, item.error
    return time.perf_counter() - start, outputs, first or 0.0


def ttft(engine, system: tuple[int, ...], question: str, tokenizer) -> float:
    prompt = system + tuple(tokenizer.encode(question, add_special_tokens=False))
    return run(engine, [prompt], 1)[2]


def multi_turn(engine, tokenizer, args, shared: bool) -> tuple[float, int]:
    """(seconds, generated tokens) of the turns of every conversation; without `shared`, each
    turn of each conversation is a fresh prompt of the same length instead (nothing in common
    with any earlier one)."""
    histories = [
        list(system_prompt(tokenizer, args.system_tokens)) for _ in range(args.conversations)
    ]
    seconds = generated = 0
    for turn in range(args.turns):
        prompts = []
        for index, history in enumerate(histories):
            question = QUESTIONS[(index + turn) % len(QUESTIONS)]
            history += tokenizer.encode(" " + question, add_special_tokens=False)
            if not shared:
                fresh = system_prompt(tokenizer, len(history), 1000 + turn * 100 + index)
                history[:] = list(fresh) + history[len(fresh) :]
            prompts.append(tuple(history))
        elapsed, outputs, _ = run(engine, prompts, args.new_tokens)
        seconds += elapsed
        for history, output in zip(histories, outputs, strict=True):
            history += output
            generated += len(output)
    return seconds, generated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system-tokens", type=int, default=1000)
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=16)
    args = parser.parse_args()

    rows = []
    hit_rate = 0.0
    for caching in (False, True):
        observer = Counts()
        loaded = load(caching, observer)
        tokenizer, engine = loaded.tokenizer, loaded.engine
        run(engine, [tuple(tokenizer.encode("warm up", add_special_tokens=False))], 2)
        misses, hits = [], []
        for attempt in range(3):
            system = system_prompt(tokenizer, args.system_tokens, 100 + attempt)
            misses.append(ttft(engine, system, QUESTIONS[0], tokenizer))
            hits.append(ttft(engine, system, QUESTIONS[1], tokenizer))
        shared = multi_turn(engine, tokenizer, args, shared=True)
        if caching and observer.queries:
            hit_rate = observer.hits / observer.queries
        apart = multi_turn(engine, tokenizer, args, shared=False)
        rows.append((caching, statistics.median(misses), statistics.median(hits), shared, apart))
        loaded.close()

    (_, miss, _, shared_off, apart_off), (_, _, hit, shared_on, apart_on) = rows
    machine = platform.processor() or platform.machine()
    print(
        f"# prefix caching: SmolLM2-135M-Instruct float32, {args.system_tokens}-token system "
        f"prompt, torch {torch.__version__}, {torch.get_num_threads()} threads, {machine}"
    )
    print(
        f"time to first token: miss {miss * 1000:.0f} ms, hit {hit * 1000:.0f} ms, "
        f"{miss / hit:.1f}x (target >= 5x)"
    )
    on, off = shared_on[1] / shared_on[0], shared_off[1] / shared_off[0]
    print(f"multi-turn tokens/s: cache off {off:.1f}, on {on:.1f}, {on / off:.2f}x (target >= 2x)")
    on, off = apart_on[1] / apart_on[0], apart_off[1] / apart_off[0]
    print(
        f"no sharing tokens/s: cache off {off:.1f}, on {on:.1f}, {on / off:.2f}x (target >= 0.98x)"
    )
    print(f"hit rate (TTFT and multi-turn runs, tokens): {hit_rate:.1%}")


if __name__ == "__main__":
    main()
