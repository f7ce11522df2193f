"""Engine throughput: SmolLM2 tokens/s at batch 1 and 16 against transformers `generate`.

Run: `.venv/bin/python bench/engine.py [--new-tokens 64] [--batch1-prompts 4]`.
Both sides decode greedily on the same chat prompts for a fixed number of new tokens
(EOS ignored), float32 on the CPU, in this one process, so the ratios compare like with like.

`--moe` instead reports (no target) a tiny random Qwen3-MoE (8 experts of width 32, top-2)
against its dense equivalent (the same model with a dense MLP of width 2 x 32 = 64 in every
layer, so both run the same MLP FLOPs per token), on random prompts.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.cli import bootstrap  # noqa: E402
from adapters.gpu.factory import RunnerSettings  # noqa: E402
from domain.engine.engine import EngineConfig  # noqa: E402
from domain.requests.engine_request import EngineRequest  # noqa: E402
from domain.requests.sampling import SamplingParams  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prompts import QUESTIONS  # noqa: E402


def chat_prompts(tokenizer) -> list[tuple[int, ...]]:
    prompts = []
    for question in QUESTIONS:
        text = tokenizer.apply_chat_template([{"role": "user", "content": question}])
        prompts.append(tuple(tokenizer.encode(text, add_special_tokens=False)))
    return prompts


def ours(engine, prompts: list[tuple[int, ...]], new_tokens: int) -> float:
    """Generated tokens per second with all `prompts` submitted at once."""
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    channels = [
        engine.submit(EngineRequest(f"b{i}-{time.monotonic_ns()}", p, params))
        for i, p in enumerate(prompts)
    ]
    start = time.perf_counter()
    while engine.has_work():
        engine.step()
    elapsed = time.perf_counter() - start
    for channel in channels:
        assert list(channel)[-1].usage.completion_tokens == new_tokens
    return len(prompts) * new_tokens / elapsed


def transformers_batch1(model, prompts: list[tuple[int, ...]], new_tokens: int) -> float:
    total = 0.0
    for prompt in prompts:
        ids = torch.tensor([prompt])
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=2,
            )
        total += time.perf_counter() - start
        assert out.shape[1] == len(prompt) + new_tokens
    return len(prompts) * new_tokens / total


def moe_rows(new_tokens: int, batch1_prompts: int) -> None:
    """Tiny MoE against its dense equivalent: transformers and helios at batch 1, helios 16."""
    import random
    import tempfile

    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.support.engines import build_engine
    from tests.support.tiny_moe_serving import build_tiny_moe_model_dir

    generator = random.Random(0)
    prompts = [tuple(generator.randrange(3, 320) for _ in range(24)) for _ in range(16)]
    shapes = {
        "tiny Qwen3-MoE (8 x 32, top-2)": {"mlp_only_layers": []},
        "dense equivalent (MLP 64)": {"mlp_only_layers": [0, 1], "intermediate_size": 64},
    }
    print(
        f"# engine benchmark, MoE: hidden 64, 2 layers, {new_tokens} new tokens, float32, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads (report only, no target)"
    )
    print(f"| {'model':<32} | {'run':<30} | {'tokens/s':>9} |")
    print(f"|{'-' * 34}|{'-' * 32}|{'-' * 11}|")
    with tempfile.TemporaryDirectory() as scratch:
        for label, overrides in shapes.items():
            directory = build_tiny_moe_model_dir(
                Path(scratch) / str(len(overrides)), "qwen3-moe", **overrides
            )
            engine, _, _ = build_engine(
                directory, max_num_seqs=16, budget=512, max_model_len=256, kv_bytes=64 << 20
            )
            ours(engine, prompts[:1], 8)  # warm-up
            reference = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
            transformers_batch1(reference.eval(), prompts[:1], 8)
            single = prompts[:batch1_prompts]
            rows = {
                "transformers generate, batch 1": transformers_batch1(
                    reference, single, new_tokens
                ),
                "helios, batch 1": sum(ours(engine, [p], new_tokens) for p in single) / len(single),
                "helios, batch 16 (aggregate)": ours(engine, prompts, new_tokens),
            }
            for run, rate in rows.items():
                print(f"| {label:<32} | {run:<30} | {rate:>9.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batch1-prompts", type=int, default=4)
    parser.add_argument("--moe", action="store_true", help="tiny MoE against its dense twin")
    args = parser.parse_args()
    if args.moe:
        moe_rows(args.new_tokens, args.batch1_prompts)
        return

    loaded = bootstrap.load(
        None,
        RunnerSettings(max_num_seqs=16, max_model_len=2048, kv_cache_bytes=512 << 20),
        EngineConfig(max_num_batched_tokens=1024),
    )
    prompts = chat_prompts(loaded.tokenizer)
    ours(loaded.engine, prompts[:1], 8)  # warm-up: first-call allocations and lazy init

    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(loaded.model_dir, dtype=torch.float32).eval()
    transformers_batch1(reference, prompts[:1], 8)

    single = prompts[: args.batch1_prompts]
    hf_b1 = transformers_batch1(reference, single, args.new_tokens)
    ours_b1 = sum(ours(loaded.engine, [p], args.new_tokens) for p in single) / len(single)
    ours_b16 = ours(loaded.engine, prompts, args.new_tokens)

    machine = platform.processor() or platform.machine()
    print(
        f"# engine benchmark: SmolLM2-135M-Instruct float32, {args.new_tokens} new tokens, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {machine}"
    )
    print(f"| {'run':<32} | {'tokens/s':>9} |")
    print(f"|{'-' * 34}|{'-' * 11}|")
    print(f"| {'transformers generate, batch 1':<32} | {hf_b1:>9.1f} |")
    print(f"| {'helios, batch 1':<32} | {ours_b1:>9.1f} |")
    print(f"| {'helios, batch 16 (aggregate)':<32} | {ours_b16:>9.1f} |")
    print(f"helios batch 1 / transformers batch 1 = {ours_b1 / hf_b1:.2f}x (target >= 1.0)")
    print(f"helios batch 16 / helios batch 1      = {ours_b16 / ours_b1:.2f}x (target >= 4.0)")


if __name__ == "__main__":
    main()
