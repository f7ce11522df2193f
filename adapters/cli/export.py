"""`helios export`: writes a model as a core directory with the chosen logprob outputs."""

from __future__ import annotations

import argparse
import sys

from adapters.cli.preflight import PreflightError, check_model
from adapters.cli.runner_args import add_batch_arguments, add_model_argument
from adapters.core.export import CoreSizes, export_core
from adapters.core.manifest import LOGPROB_LEVELS
from domain.contract.capabilities import scored_capacities
from domain.contract.core_validation import CoreValidationError
from domain.logprobs.values import NATURAL_TOP_K


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("export", help="export a model as a core directory")
    add_model_argument(parser, "model")
    parser.add_argument("--output", required=True, help="the core directory to create")
    parser.add_argument(
        "--logprobs",
        choices=LOGPROB_LEVELS,
        default="full",
        help="logprob outputs: none, natural alternatives only, or the full contract (default)",
    )
    parser.add_argument(
        "--top-k",
        type=int,
        default=NATURAL_TOP_K,
        help=f"natural alternatives K, 1..{NATURAL_TOP_K} (natural cores; full cores need "
        f"{NATURAL_TOP_K})",
    )
    parser.add_argument(
        "--token-capacity",
        type=int,
        default=0,
        help="T, token words per completion record (0: the default, 8)",
    )
    parser.add_argument(
        "--prompt-logprobs",
        action="store_true",
        help="declare prompt scoring (prompt logprobs; needs K=20): scored prefill graphs and "
        "their buffers, which cost device memory when served (default: off)",
    )
    add_batch_arguments(
        parser,
        seqs_help="requests served at once; the core's capacity pads it to a multiple of 8",
        tokens_help="the prefill chunk limit: the largest scored capacity (with --prompt-logprobs)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        # The same start-up check as serve and generate: a model that cannot load is refused
        # in one line before a GGUF is exported or anything is written.
        check_model(args.model)
    except PreflightError as error:
        print(f"helios export: error: {error}", file=sys.stderr)
        return 2
    try:
        if args.prompt_logprobs:
            # A non-positive limit would silently mean "no scoring"; refuse it instead.
            scored_capacities(args.max_num_batched_tokens)
        chunk_limit = args.max_num_batched_tokens if args.prompt_logprobs else 0
        sizes = CoreSizes(args.max_num_seqs, args.token_capacity, chunk_limit)
        core = export_core(
            args.model, args.output, logprobs=args.logprobs, top_k=args.top_k, sizes=sizes
        )
    except (CoreValidationError, ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    capability = core.capability
    logprobs = (
        "no logprobs"
        if not capability.enabled
        else f"K={capability.top_k}" + (" and selected IDs" if capability.selects_ids else "")
    )
    scoring = (
        f"prompt scoring at capacities {', '.join(map(str, capability.scored_capacities))}"
        if capability.scores_prompts
        else "no prompt scoring"
    )
    print(
        f"exported core to {args.output}: capacity {core.capacity}, "
        f"T={core.token_capacity}, {logprobs}, {scoring}"
    )
    return 0
