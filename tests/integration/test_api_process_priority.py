"""An API process lowers its own CPU priority by `--api-server-nice`, and only by 0 to 19."""

from __future__ import annotations

import argparse
import os

import pytest

from adapters.cli import serve
from adapters.cli.priority import yield_cpu_to_engine


def _in_child(action) -> int:
    """Runs `action` in a forked child and returns the child's nice value after it."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        os.close(read)
        action()
        os.write(write, str(os.nice(0)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        nice = int(pipe.read())
    os.waitpid(child, 0)
    return nice


@pytest.mark.skipif(not hasattr(os, "nice"), reason="no nice values here")
def test_an_increment_lowers_the_process_s_priority_by_that_much() -> None:
    base = os.nice(0)
    assert _in_child(lambda: yield_cpu_to_engine(5)) == min(base + 5, 19)
    assert os.nice(0) == base


@pytest.mark.skipif(not hasattr(os, "nice"), reason="no nice values here")
def test_a_zero_increment_keeps_the_priority() -> None:
    assert _in_child(lambda: yield_cpu_to_engine(0)) == os.nice(0)


def _serve_flags(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["serve", *flags])


def test_serve_lowers_the_api_processes_by_five_unless_told_otherwise() -> None:
    assert _serve_flags().api_server_nice == 5
    assert _serve_flags("--api-server-nice", "0").api_server_nice == 0
    assert _serve_flags("--api-server-nice", "19").api_server_nice == 19


@pytest.mark.parametrize("increment", ["-1", "20", "five"])
def test_a_nice_increment_outside_0_to_19_is_a_usage_error(increment, capsys) -> None:
    with pytest.raises(SystemExit):
        _serve_flags("--api-server-nice", increment)

    assert "--api-server-nice" in capsys.readouterr().err
