"""Scored prefill: prompt tokens/s of echo+logprobs requests against ordinary prefill, same run.

Run: `.venv/bin/python bench/prompt.py [--prompt-tokens L] [--clients C] [--rounds R]`.
It starts `helios serve --prompt-logprobs` (the embedded SmolLM2-135M, CPU) on a free port and
sends token-ID prompts of L tokens with `max_tokens: 1` from C concurrent clients, as
lm-evaluation-harness does: ordinary requests, then scored ones (`echo: true` with `logprobs` 0
and 20, so the ratio includes formatting the prompt's logprob arrays). Variants rotate order
each round and the median round counts. A second server without the flag measures ordinary
prefill again, to show what the flag costs requests that do not score. Every variant's run
sends its own `cache_salt`, so ordinary requests compute every prompt row as scored ones do,
instead of reading the previous round's blocks from the prefix cache. It also prints the flag's
fixed scoring storage and what it takes from the KV pool. Target (issue 21): scored / ordinary
>= 0.7x at K=0 and K=20.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import httpx2

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prompts import QUESTIONS  # noqa: E402
from serve import REQUEST_TIMEOUT_S, own_server, run_clients, served_model  # noqa: E402

VARIANTS = {
    "ordinary": {},
    "scored K=0": {"echo": True, "logprobs": 0},
    "scored K=20": {"echo": True, "logprobs": 20},
}
MAX_NUM_SEQS = 16
MAX_MODEL_LEN = 2048
CHUNK_LIMIT = 512  # `helios serve`'s default --max-num-batched-tokens
TARGET = 0.7


def token_prompts(url: str, count: int, length: int) -> list[list[int]]:
    """`count` different windows of `length` tokens over the benchmark questions."""
    text = " ".join(QUESTIONS * (1 + (count + length) // 8))
    with httpx2.Client(timeout=60) as client:
        response = client.post(f"{url}/tokenize", json={"prompt": text})
        response.raise_for_status()
        tokens = response.json()["tokens"]
    if len(tokens) < count + length:
        raise RuntimeError(f"only {len(tokens)} tokens of text for {count} prompts of {length}")
    return [tokens[start : start + length] for start in range(count)]


def run_variant(
    url: str, model: str, prompts: list[list[int]], clients: int, extra: dict, salt: str
) -> float:
    """Prompt tokens per second while `clients` threads send the prompts back to back, each
    with `salt` as its `cache_salt`: a run salted apart from the others finds none of their
    blocks in the prefix cache."""

    def work(index: int, client: httpx2.Client) -> None:
        for prompt in prompts[index::clients]:
            body = {
                "model": model,
                "prompt": prompt,
                "max_tokens": 1,
                "temperature": 0,
                "cache_salt": salt,
            }
            response = client.post(f"{url}/v1/completions", json={**body, **extra})
            response.raise_for_status()
            check(response.json(), len(prompt), extra)

    wall_s = run_clients(clients, work)
    return sum(len(prompt) for prompt in prompts) / wall_s


def check(body: dict, prompt_len: int, extra: dict) -> None:
    """A scored answer must carry one entry per prompt token plus the generated one."""
    logprobs = body["choices"][0]["logprobs"]
    if not extra:
        return
    if len(logprobs["tokens"]) != prompt_len + 1 or logprobs["token_logprobs"][0] is not None:
        raise RuntimeError(f"a scored answer has {len(logprobs['tokens'])} entries")


def measure(url: str, prompts: list[list[int]], clients: int, rounds: int, names) -> dict:
    with httpx2.Client(timeout=REQUEST_TIMEOUT_S) as client:
        model = served_model(client, url)
    for name in names:  # warm-up: every variant once
        run_variant(url, model, prompts[:clients], clients, VARIANTS[name], f"warm-up {name}")
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        order = list(names)
        order = order[round_index % len(order) :] + order[: round_index % len(order)]
        for name in order:
            salt = f"round {round_index} {name}"
            samples[name].append(run_variant(url, model, prompts, clients, VARIANTS[name], salt))
    return {name: statistics.median(values) for name, values in samples.items()}


def memory_cost() -> str:
    """The flag's fixed scoring bytes and the KV blocks they take from the default pool."""
    import torch

    from adapters.gpu.loading.default_model import resolve_model_dir
    from adapters.gpu.model.config import ModelConfig
    from adapters.gpu.model.kv_cache import PagedKVCache
    from adapters.gpu.scoring.prompt_score_frames import PromptScoreFrames
    from domain.contract.capabilities import scored_capacities

    config = ModelConfig.from_dir(resolve_model_dir(None, progress=False))
    capacities = scored_capacities(CHUNK_LIMIT)
    fixed = PromptScoreFrames.fixed_bytes(capacities, config.vocab_size)
    budget = 1 << 30  # the CPU default pool
    plain = PagedKVCache.blocks_for_budget(config, budget, 16, torch.float32)
    scoring = PagedKVCache.blocks_for_budget(config, budget - fixed, 16, torch.float32)
    return (
        f"scored capacities {capacities}; fixed scoring storage {fixed / 2**20:.2f} MiB "
        f"(prompt_logprobs frames, targets, pooled [64, {config.vocab_size}] FP32 block); "
        f"KV blocks of 16 in the 1 GiB CPU pool: {plain} without the flag, {scoring} with it "
        f"({100 * (plain - scoring) / plain:.2f}% less)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=16, help="requests per variant and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with own_server(MAX_NUM_SEQS, MAX_MODEL_LEN, ("--prompt-logprobs",)) as url:
        prompts = token_prompts(url, args.prompts, args.prompt_tokens)
        scored = measure(url, prompts, args.clients, args.rounds, list(VARIANTS))
    with own_server(MAX_NUM_SEQS, MAX_MODEL_LEN) as url:
        flag_off = measure(url, prompts, args.clients, args.rounds, ["ordinary"])["ordinary"]
    base = scored["ordinary"]
    print(
        f"SmolLM2-135M, CPU; {args.prompts} token-ID prompts of {args.prompt_tokens} tokens, "
        f"max_tokens 1, {args.clients} clients, median of {args.rounds} rounds\n"
    )
    print("| server | requests | prompt tok/s | vs ordinary |")
    print("|---|---|---|---|")
    print(f"| --prompt-logprobs | ordinary | {base:.0f} | 1.00x |")
    for name in ("scored K=0", "scored K=20"):
        print(f"| --prompt-logprobs | {name} | {scored[name]:.0f} | {scored[name] / base:.2f}x |")
    print(f"| flag off | ordinary | {flag_off:.0f} | {flag_off / base:.2f}x |")
    print(
        f"\nscored/ordinary: K=0 {scored['scored K=0'] / base:.2f}x, "
        f"K=20 {scored['scored K=20'] / base:.2f}x (target >= {TARGET}x at both)"
    )
    print(memory_cost())
    return 0


if __name__ == "__main__":
    sys.exit(main())
