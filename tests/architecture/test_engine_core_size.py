"""The engine core stays a core: each feature's state and rules live in its own package."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from domain.engine.sequence import Sequence
from domain.engine.step import SlotWork

DOMAIN = Path(__file__).resolve().parents[2] / "domain"


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_the_engine_core_holds_at_most_950_lines():
    total = sum(_lines(path) for path in (DOMAIN / "engine").glob("*.py"))

    assert total <= 950, f"domain/engine holds {total} lines; move feature logic to its part"


def test_no_domain_module_is_over_300_lines():
    long = {str(p.relative_to(DOMAIN)): _lines(p) for p in DOMAIN.rglob("*.py") if _lines(p) > 300}

    assert not long, long


def test_a_sequence_and_a_lane_carry_at_most_12_fields_each():
    counts = {kind.__name__: len(dataclasses.fields(kind)) for kind in (Sequence, SlotWork)}

    assert all(count <= 12 for count in counts.values()), counts
