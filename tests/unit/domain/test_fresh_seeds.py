"""Seeds for unseeded requests: 63 bits, distinct, and never shared with a forked process."""

from __future__ import annotations

import os

from domain.requests.engine_request import fresh_seed


def test_fresh_seeds_are_63_bit_and_distinct() -> None:
    seeds = [fresh_seed() for _ in range(1000)]
    assert all(0 <= seed < 1 << 63 for seed in seeds)
    assert len(set(seeds)) == len(seeds)


def test_a_forked_child_draws_other_seeds_than_its_parent() -> None:
    fresh_seed()  # the parent's generator exists before the fork
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        os.close(read)
        os.write(write, b",".join(str(fresh_seed()).encode() for _ in range(8)))
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        child_seeds = [int(text) for text in pipe.read().split(b",")]
    os.waitpid(child, 0)
    parent_seeds = [fresh_seed() for _ in range(8)]
    assert not set(child_seeds) & set(parent_seeds)
