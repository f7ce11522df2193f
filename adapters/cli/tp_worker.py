"""`helios tp-worker`: one tensor-parallel peer rank, started where rank 0 cannot spawn it."""

from __future__ import annotations

import argparse
import logging
import sys

from adapters.cli.runner_args import add_device_argument
from adapters.gpu.distributed.collectives import ParallelFailure
from adapters.gpu.distributed.group import Rendezvous
from adapters.gpu.distributed.launch import run_peer


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "tp-worker",
        help="join a tensor-parallel world as a peer rank (torchrun's variables: MASTER_ADDR, "
        "MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK)",
        description="Joins the world whose rank 0 is `helios serve --tensor-parallel-size N` at "
        "MASTER_ADDR:MASTER_PORT. Everything else (model, settings) comes from rank 0; the model "
        "directory must be at the same path on this machine.",
    )
    add_device_argument(parser)
    parser.add_argument(
        "--local-ranks",
        type=int,
        default=1,
        help="ranks on this machine, which share its CPU cores (default 1)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO)
    try:
        rendezvous = Rendezvous.from_environment()
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if rendezvous.rank == 0:
        print("error: rank 0 is `helios serve`; a tp-worker is rank 1 or more", file=sys.stderr)
        return 2
    try:
        run_peer(rendezvous, args.device, args.local_ranks)
    except ParallelFailure as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0
