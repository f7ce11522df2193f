"""`helios generate`: runs one prompt through the engine offline and prints the text as it comes."""

from __future__ import annotations

import argparse
import sys
import uuid

from adapters.cli import bootstrap
from adapters.cli.preflight import PreflightError, check_models
from adapters.cli.runner_args import (
    add_runner_arguments,
    engine_config,
    parallel_launch,
    runner_settings,
)
from domain.common.errors import DomainError
from domain.emission.outputs import ChoiceDelta, RequestEnd
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("generate", help="generate text for one prompt, offline")
    parser.add_argument("--prompt", required=True)
    parser.add_argument(
        "--chat",
        action="store_true",
        help="send the prompt as a user message through the chat template",
    )
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None)
    add_runner_arguments(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    runner, engine = runner_settings(args), engine_config(args)
    try:
        check_models(args.model, runner, engine.speculative)
    except PreflightError as error:
        print(f"helios generate: error: {error}", file=sys.stderr)
        return 1
    loaded = bootstrap.load(args.model, runner, engine, parallel=parallel_launch(args))
    try:
        return _generate(args, loaded)
    finally:
        loaded.close()


def _generate(args: argparse.Namespace, loaded: bootstrap.LoadedModel) -> int:
    tokenizer = loaded.tokenizer
    if args.chat:
        text = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}])
        prompt = tokenizer.encode(text, add_special_tokens=False)
    else:
        prompt = tokenizer.encode(args.prompt)
    try:
        params = SamplingParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            seed=args.seed,
        )
        channel = loaded.engine.submit(EngineRequest(uuid.uuid4().hex, tuple(prompt), params))
    except DomainError as error:
        print(f"error: {error.message}", file=sys.stderr)
        return 2
    while True:
        loaded.engine.step()
        while (item := channel.get_nowait()) is not None:
            if isinstance(item, ChoiceDelta):
                sys.stdout.write(item.text)
                sys.stdout.flush()
            elif isinstance(item, RequestEnd):
                sys.stdout.write("\n")
                if item.error:
                    print(f"error: {item.error}", file=sys.stderr)
                    return 1
                return 0
