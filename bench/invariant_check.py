"""Batch-invariant mode on 50 SmolLM2 prompts: each of issue 22's axes against batch 1, bitwise.

Run: `.venv/bin/python -u bench/invariant_check.py [--prompts 50] [--max-tokens 16]`.
The reference runs each prompt alone, its whole prompt in one chunk, without the prefix cache
or speculation. Each other run changes one thing: batch 16, prefill chunks of 16 or 64 tokens,
a second pass over a warm prefix cache (every prompt's full blocks are hits), n-gram
speculation in batch 16. Tokens and every logprob entry (chosen and top-20, as exact reprs) must
equal the reference's; the default kernels' batch 16 is reported against their batch 1 (tokens
equal, values within 1e-4: 6.9e-5 measured on these 50 prompts, 2.7e-5 on the speculation
test's). Prints a table; exits 1 if any check fails.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.cli import bootstrap  # noqa: E402
from adapters.gpu.factory import RunnerSettings  # noqa: E402
from domain.engine.engine import EngineConfig  # noqa: E402
from domain.speculation.drafts import SpeculativeConfig, SpeculativeMethod  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from invariant import differing, measure  # noqa: E402
from prompts import QUESTIONS  # noqa: E402

ASIDES = ("", " Answer briefly.", " Explain it to a child.", " Use one sentence.")
DEFAULT_BOUND = 1e-4
UNCHUNKED = 2048
_FLOAT = re.compile(r"-?\d+\.\d+(?:e-?\d+)?|-?inf")


def engine(
    invariant: bool,
    budget: int = UNCHUNKED,
    prefix_caching: str | None = None,
    speculative: SpeculativeConfig | None = None,
) -> bootstrap.LoadedModel:
    runner = RunnerSettings(
        device="cpu",
        max_num_seqs=16,
        max_model_len=2048,
        kv_cache_bytes=256 << 20,
        batch_invariant=invariant,
    )
    config = EngineConfig(
        max_num_batched_tokens=budget, prefix_caching=prefix_caching, speculative=speculative
    )
    return bootstrap.load(None, runner, config)


def largest_difference(first: dict[str, list[str]], second: dict[str, list[str]]) -> float:
    """The largest gap between same-placed numbers of two runs' entry reprs."""
    gap = 0.0
    for name, entries in first.items():
        for a, b in zip(entries, second[name], strict=False):
            for x, y in zip(_FLOAT.findall(a), _FLOAT.findall(b), strict=False):
                if x != y:
                    gap = max(gap, abs(float(x) - float(y)))
    return gap


def tokens_of(entries: dict[str, list[str]]) -> dict[str, list[str]]:
    """Each request's chosen tokens: the first `token_id=` of every entry repr."""
    return {
        name: [re.search(r"token_id=(\d+)", entry).group(1) for entry in items]  # type: ignore[union-attr]
        for name, items in entries.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=50)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()

    loaded = engine(invariant=True)
    tokenizer = loaded.tokenizer
    questions = [question + aside for aside in ASIDES for question in QUESTIONS]
    prompts = []
    for question in questions[: args.prompts]:
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": question}])
        prompts.append(tuple(tokenizer.encode(rendered, add_special_tokens=False)))

    started = time.perf_counter()
    reference = measure(loaded.engine, prompts, 1, args.max_tokens).entries
    ngram = SpeculativeConfig(SpeculativeMethod.NGRAM, 4, 2, 4)
    # (run, engine settings, batch, passes): the last pass is compared; a second pass over the
    # same engine reads every prompt's full blocks from the prefix cache.
    runs = (
        ("batch 16", {}, 16, 1),
        ("chunks of 16, batch 16", {"budget": 16}, 16, 1),
        ("chunks of 64, batch 16", {"budget": 64}, 16, 1),
        ("prefix cache hits, batch 1", {"prefix_caching": "sha256"}, 1, 2),
        ("n-gram speculation, batch 16", {"speculative": ngram}, 16, 1),
    )

    print(
        f"# batch-invariant check: SmolLM2-135M-Instruct float32 CPU, {len(prompts)} prompts, "
        f"greedy, max {args.max_tokens} tokens, logprobs 20; reference: invariant, batch 1, "
        "unchunked, no cache, no speculation"
    )
    print("| run | entries compared | entries differing (bits) | result |")
    print("|---|---|---|---|")
    failed = False
    for name, settings, batch, passes in runs:
        under_test = engine(True, **settings).engine
        for _ in range(passes):
            got = measure(under_test, prompts, batch, args.max_tokens).entries
        differ, compared = differing(reference, got)
        complete = all(len(got[key]) == len(value) for key, value in reference.items())
        ok = differ == 0 and complete and compared > 0
        failed |= not ok
        print(f"| {name} | {compared} | {differ} | {'identical' if ok else 'DIFFERENT'} |")
    default_one = measure(engine(False).engine, prompts, 1, args.max_tokens).entries
    default_sixteen = measure(engine(False).engine, prompts, 16, args.max_tokens).entries
    differ, compared = differing(default_one, default_sixteen)
    same_tokens = tokens_of(default_one) == tokens_of(default_sixteen)
    gap = largest_difference(default_one, default_sixteen)
    ok = same_tokens and gap <= DEFAULT_BOUND
    failed |= not ok
    print(
        f"| default kernels, batch 16 vs 1 | {compared} | {differ} | tokens "
        f"{'equal' if same_tokens else 'DIFFER'}, largest gap {gap:.2e} (bound {DEFAULT_BOUND}) |"
    )
    print(f"# {time.perf_counter() - started:.0f} s; {'FAILED' if failed else 'all checks pass'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
