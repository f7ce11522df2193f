"""Where the exact CPU reduction spends its time, stage by stage, torch recipe against compiled.

Run: `.venv/bin/python bench/cpu_reduction.py [--vocab 49152,151936] [--rows 1,64] [--calls N]
[--threads T]`. For each vocabulary and row count it times, on FP32 rows of N(0, 4^2) logits
(bf16 for the reducer, as a model hands them over): the tile statistics, their combination, the
whole log normalizer, the top-20 sort keys and the strictly-greater count (the prompt rank) of
the reported values, one `ReferenceLogprobReducer.reduce` with every row requesting natural
K=20, and one prompt-scorer block (`PromptScorer._block_of` then `_rows`). Each is timed with the
compiled library switched off (the torch recipe) and on (`make native`), in the same process;
the best of --calls calls is reported in microseconds per row, since on a shared box the best
call is the one least disturbed. Both paths give the same bits (tests/integration/torch/
test_native_reduction.py); this script only times them.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from adapters.gpu.logprobs import native_reduction  # noqa: E402
from adapters.gpu.logprobs.keys import greater_counts, top_sort_keys  # noqa: E402
from adapters.gpu.logprobs.normalizer import (  # noqa: E402
    combine_tiles,
    log_normalizer,
    tile_statistics,
)
from adapters.gpu.logprobs.reducer import ReductionInputs  # noqa: E402
from adapters.gpu.logprobs.reference_reducer import ReferenceLogprobReducer  # noqa: E402
from adapters.gpu.scoring.prompt_scorer import PROJECTION_ROWS, PromptScorer  # noqa: E402
from domain.logprobs.values import NATURAL_TOP_K  # noqa: E402


def best_us(call: Callable[[], object], calls: int) -> float:
    """The fastest of `calls` calls after two warm-up calls, in microseconds."""
    call()
    call()
    best = float("inf")
    for _ in range(calls):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return best * 1e6


def stages(rows: int, vocab: int) -> dict[str, Callable[[], object]]:
    """The timed calls over one fixed input; each leaves its inputs as it found them."""
    generator = torch.Generator().manual_seed(rows * vocab)
    logits = torch.randn(rows, vocab, generator=generator) * 4
    peaks, masses = tile_statistics(logits)
    values = logits - log_normalizer(logits)[:, None]
    pivots = values[:, 0].clone()
    reducer = ReferenceLogprobReducer(vocab, NATURAL_TOP_K)
    out = torch.zeros(rows, 1, 2 + 2 * NATURAL_TOP_K, dtype=torch.int32)
    inputs = ReductionInputs(
        logits.to(torch.bfloat16),
        torch.arange(rows),
        torch.zeros(rows, dtype=torch.int64),
        torch.randint(vocab, (rows,), generator=generator),
        torch.ones(rows, dtype=torch.int32),
        None,
        None,
        out,
    )
    scorer = PromptScorer(vocab)
    pooled = torch.empty(PROJECTION_ROWS, vocab)[:rows]
    targets = torch.randint(vocab, (rows,), generator=generator)

    def score_block() -> object:
        return scorer._rows(scorer._block_of(logits, pooled), targets)

    return {
        "tile statistics": lambda: tile_statistics(logits),
        "combine tiles": lambda: combine_tiles(peaks, masses),
        "log normalizer": lambda: log_normalizer(logits),
        "top-20 sort keys": lambda: top_sort_keys(values, NATURAL_TOP_K),
        "greater count (rank)": lambda: greater_counts(values, pivots),
        "reference reducer, bf16": lambda: reducer.reduce(inputs),
        "prompt scorer block": score_block,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", default="49152,151936", help="comma-separated sizes")
    parser.add_argument("--rows", default="1,64", help="comma-separated row counts")
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    library = native_reduction.library()
    if library is None:
        print("the compiled library is missing or switched off: run `make native`")
        return 1
    width = library.helios_vector_width(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; kernels {width} lanes")
    print("best of", args.calls, "calls, microseconds per row\n")
    print("| vocab | rows | stage | torch recipe | compiled | speed-up |")
    print("|---|---|---|---|---|---|")
    for vocab in (int(part) for part in args.vocab.split(",")):
        for rows in (int(part) for part in args.rows.split(",")):
            timed = stages(rows, vocab)
            for name, call in timed.items():
                fast = best_us(call, args.calls) / rows
                slow = best_us(without_library(call), args.calls) / rows
                cells = [f"{vocab:,}", f"{rows}", name, f"{slow:.1f}", f"{fast:.1f}"]
                print("| " + " | ".join(cells) + f" | {slow / fast:.1f}x |", flush=True)
    return 0


def without_library(call: Callable[[], object]) -> Callable[[], object]:
    """`call` with the compiled library switched off for its duration."""

    def switched_off() -> object:
        original = native_reduction.library
        native_reduction.library = lambda: None  # type: ignore[assignment]
        try:
            return call()
        finally:
            native_reduction.library = original

    return switched_off


if __name__ == "__main__":
    sys.exit(main())
