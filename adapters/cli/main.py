"""The `helios` command: `generate` runs the engine offline; more subcommands join as they land."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from adapters.cli import export, generate, serve, tp_worker


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="helios", description="Helios LLM inference server")
    commands = parser.add_subparsers(dest="command", required=True)
    generate.add_parser(commands)
    serve.add_parser(commands)
    export.add_parser(commands)
    tp_worker.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
