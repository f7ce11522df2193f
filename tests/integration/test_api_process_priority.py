"""An API process lowers its own CPU priority, and only by a positive increment."""

from __future__ import annotations

import os

import pytest

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
