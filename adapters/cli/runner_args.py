"""Model and runner flags shared by the subcommands, with vLLM's names."""

from __future__ import annotations

import argparse

from adapters.cli.families import help_text
from adapters.gpu.distributed.launch import ParallelLaunch
from adapters.gpu.factory import RunnerSettings
from domain.cache.pool import HASH_ALGOS
from domain.engine.engine import EngineConfig
from domain.speculation.drafts import SpeculativeConfig, SpeculativeConfigError

MODEL_HELP = (
    "Hugging Face model directory, .gguf file or core (default: the embedded SmolLM2-135M); "
    f"architectures served: {help_text()}"
)


def add_model_argument(parser: argparse.ArgumentParser, dest: str) -> None:
    """The optional MODEL positional of `serve` and `export` (the same as `--model`)."""
    parser.add_argument(dest, nargs="?", default=None, metavar="MODEL", help=MODEL_HELP)


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    """`--device` of every subcommand that runs the model (auto: CUDA where there is one)."""
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))


def add_batch_arguments(
    parser: argparse.ArgumentParser, seqs_help: str | None = None, tokens_help: str | None = None
) -> None:
    """`--max-num-seqs` and `--max-num-batched-tokens` (the prefill chunk limit), with the same
    defaults for `serve` and `export`, so that a core exported with them serves them."""
    parser.add_argument("--max-num-seqs", type=int, default=16, help=seqs_help)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512, help=tokens_help)


def add_runner_arguments(
    parser: argparse.ArgumentParser, model_positional: str | None = None
) -> None:
    """The runner flags; `model_positional` names an optional MODEL positional as well."""
    if model_positional is not None:
        add_model_argument(parser, model_positional)
    parser.add_argument("--model", default=None, help=MODEL_HELP)
    add_device_argument(parser)
    parser.add_argument(
        "--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16")
    )
    add_batch_arguments(parser)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument(
        "--kv-cache-memory",
        type=int,
        default=None,
        help="bytes for the paged KV cache (default: 1 GiB on CPU, 80%% free on CUDA)",
    )
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument(
        "--logprobs-backend",
        default="auto",
        choices=("auto", "reference", "triton"),
        help="logprob reduction: triton on CUDA, the torch reference elsewhere",
    )
    parser.add_argument(
        "--prompt-logprobs",
        action="store_true",
        help="serve prompt scoring (prompt_logprobs, echo with logprobs): scored prefill graphs "
        "at capacities up to --max-num-batched-tokens; costs KV capacity and device memory. "
        "An exported core must declare it (helios export --prompt-logprobs)",
    )
    parser.add_argument(
        "--tensor-parallel-size",
        "-tp",
        type=int,
        default=1,
        help="ranks that share the model (torch.distributed: NCCL on GPUs, gloo on CPUs); "
        "rank 0 serves, the others are spawned here or join with `helios tp-worker`",
    )
    parser.add_argument(
        "--tensor-parallel-local-ranks",
        type=int,
        default=None,
        metavar="M",
        help="ranks 0..M-1 run on this machine (default: all); ranks M.. start elsewhere with "
        "`helios tp-worker` and meet at MASTER_ADDR:MASTER_PORT",
    )
    parser.add_argument(
        "--collective-timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long a tensor-parallel exchange waits for a peer before the step fails "
        "(start-up included)",
    )
    parser.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reuse the KV blocks of a repeated prompt prefix (vLLM's flag; on by default): "
        "full blocks of committed tokens are kept, keyed by a chained hash, until their memory "
        "is needed; --no-enable-prefix-caching computes every prompt",
    )
    parser.add_argument(
        "--prefix-caching-hash-algo",
        choices=HASH_ALGOS,
        default="sha256",
        help="the hash that keys cached blocks (both collision-resistant; every hit is also "
        "checked token by token): sha256, or blake2b, faster in CPython",
    )
    parser.add_argument(
        "--batch-invariant",
        action="store_true",
        help="batch-invariant kernels (vLLM's VLLM_BATCH_INVARIANT): a request's tokens and "
        "logprob bits do not depend on its batch, its prefill chunks or speculation; slower "
        "(contracts/api.md, 'Batch-invariant mode')",
    )
    parser.add_argument(
        "--speculative-config",
        type=_speculative_config,
        default=None,
        metavar="JSON",
        help='speculative decoding, vLLM\'s JSON: {"method": "ngram", '
        '"num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4} or '
        '{"method": "draft_model", "model": DIR_OR_GGUF, "num_speculative_tokens": 4}',
    )


def _speculative_config(text: str) -> SpeculativeConfig:
    """argparse's type: a malformed config is a usage error before anything loads."""
    try:
        return SpeculativeConfig.from_json(text)
    except SpeculativeConfigError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def runner_settings(args: argparse.Namespace) -> RunnerSettings:
    return RunnerSettings(
        device=args.device,
        dtype=args.dtype,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        kv_cache_bytes=args.kv_cache_memory,
        block_size=args.block_size,
        logprobs_backend=args.logprobs_backend,
        prompt_logprobs=args.prompt_logprobs,
        tensor_parallel_size=args.tensor_parallel_size,
        batch_invariant=args.batch_invariant,
    )


def parallel_launch(args: argparse.Namespace) -> ParallelLaunch:
    return ParallelLaunch(
        local_ranks=args.tensor_parallel_local_ranks, timeout_s=args.collective_timeout
    )


def prefix_caching(args: argparse.Namespace) -> str | None:
    """The prefix cache's hash algorithm, or None when the cache is off."""
    return args.prefix_caching_hash_algo if args.enable_prefix_caching else None


def engine_config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        speculative=args.speculative_config,
        prefix_caching=prefix_caching(args),
    )
