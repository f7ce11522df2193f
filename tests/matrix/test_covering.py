"""The covering-array generator and the matrix it builds: every pair covered, no row forbidden."""

from __future__ import annotations

import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.matrix.covering import Factor, completable, full_product, pairwise, required_pairs
from tests.matrix.factors import (
    BEGIN,
    DOC,
    END,
    FACTORS,
    expressible,
    full_rows,
    pairwise_rows,
    refusal_params,
    served,
    table_text,
)


def pairs_of(rows: list[dict[str, str]], factors) -> set:
    found = set()
    for row in rows:
        for first, second in itertools.combinations(factors, 2):
            found.add(((first.name, row[first.name]), (second.name, row[second.name])))
    return found


def every_pair(factors) -> set:
    return {
        ((first.name, a), (second.name, b))
        for first, second in itertools.combinations(factors, 2)
        for a in first.values
        for b in second.values
    }


factor_sets = st.lists(st.integers(1, 5), min_size=2, max_size=7).map(
    lambda sizes: [
        Factor(f"f{i}", tuple(f"v{j}" for j in range(size))) for i, size in enumerate(sizes)
    ]
)


@settings(max_examples=40)
@given(factor_sets, st.integers(0, 3))
def test_every_pair_of_every_two_factors_is_in_some_row(factors, seed):
    rows = pairwise(factors, seed=seed)

    assert pairs_of(rows, factors) == every_pair(factors)
    assert all(set(row) == {f.name for f in factors} for row in rows)


@settings(max_examples=25)
@given(factor_sets)
def test_a_table_is_no_longer_than_the_full_product_and_the_same_for_a_seed(factors):
    rows = pairwise(factors, seed=5)

    assert len(rows) <= math.prod(len(f.values) for f in factors)
    assert pairwise(factors, seed=5) == rows


def test_the_full_product_lists_every_allowed_combination_once():
    factors = [Factor("a", ("0", "1", "2")), Factor("b", ("0", "1")), Factor("c", ("0", "1"))]

    rows = list(full_product(factors, lambda row: row.get("a") != "2" or row.get("b") != "1"))

    assert len(rows) == 12 - 2
    assert len({tuple(row.values()) for row in rows}) == len(rows)


def test_two_factors_of_three_and_four_values_need_exactly_their_product():
    factors = [Factor("a", ("1", "2", "3")), Factor("b", ("x", "y", "z", "w"))]

    assert len(pairwise(factors)) == 12


def test_constraints_keep_forbidden_rows_out_and_implied_pairs_uncovered():
    factors = [Factor("a", ("0", "1")), Factor("b", ("0", "1")), Factor("c", ("0", "1"))]

    # a=1 forces b=1, and b=1 forbids c=1: so a=1 never meets c=1 either.
    def allowed(row):
        return not (row.get("a") == "1" and row.get("b") == "0") and not (
            row.get("b") == "1" and row.get("c") == "1"
        )

    rows = pairwise(factors, allowed)
    assert all(allowed(row) for row in rows)
    assert (("a", "1"), ("c", "1")) not in required_pairs(factors, allowed)
    assert not completable({"a": "1", "c": "1"}, factors, allowed)
    assert pairs_of(rows, factors) >= required_pairs(factors, allowed)


def test_the_matrix_covers_every_pair_a_request_can_express():
    rows = list(pairwise_rows())

    assert pairs_of(rows, FACTORS) >= required_pairs(FACTORS, expressible)
    assert all(expressible(row) for row in rows)


def test_every_pair_a_served_request_can_hold_is_in_a_served_row():
    served_rows = [row for row in pairwise_rows() if not refusal_params(row)]

    assert pairs_of(served_rows, FACTORS) >= required_pairs(FACTORS, served)


def test_the_matrix_is_a_small_part_of_the_full_product():
    rows = list(pairwise_rows())

    assert len(rows) < 100
    assert len({tuple(sorted(row.items())) for row in rows}) == len(rows)
    # The full product is what `make test-matrix` runs; the count is in docs/matrix.md.
    assert len(full_rows()) == 233_472


def test_docs_matrix_shows_the_generated_table():
    # `python -m tests.matrix.factors --write-doc` rewrites it after a change of the factors.
    assert f"{BEGIN}\n{table_text()}\n{END}" in DOC.read_text(encoding="utf-8")
