"""Pairwise covering arrays: every value pair of every two factors in some row, generated greedily.

An AETG-style construction (Cohen et al., 1997): each new row starts from a pair no row covers
yet, then fixes the remaining factors one at a time, in a shuffled order, to the value that
covers the most new pairs with the factors already fixed; of several such candidate rows the one
covering the most new pairs is kept. A seeded `random.Random` makes every choice, so a seed always
gives the same table. `allowed` rules out combinations: it sees partial rows (only the factors
fixed so far) and must answer False only when those values can never go together. A pair that
no complete allowed row holds (a depth-first search decides) needs no covering. Pure Python,
no test framework: the table can be printed anywhere.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

Row = dict[str, str]
Allowed = Callable[[Mapping[str, str]], bool]


@dataclass(frozen=True)
class Factor:
    """One dimension of the matrix and the values it takes (names, so tables stay readable)."""

    name: str
    values: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.values or len(set(self.values)) != len(self.values):
            raise ValueError(f"factor {self.name!r} needs distinct values, at least one")


def _always(row: Mapping[str, str]) -> bool:
    return True


Pair = tuple[tuple[str, str], tuple[str, str]]


def completable(row: Mapping[str, str], factors: Sequence[Factor], allowed: Allowed) -> bool:
    """Whether some complete allowed row extends the partial `row` (a depth-first search that
    prunes on `allowed` at every step)."""
    if not allowed(row):
        return False
    rest = [factor for factor in factors if factor.name not in row]
    if not rest:
        return True
    first, *_ = rest
    return any(completable({**row, first.name: value}, factors, allowed) for value in first.values)


def required_pairs(factors: Sequence[Factor], allowed: Allowed = _always) -> set[Pair]:
    """Every value pair of two different factors that some complete allowed row holds."""
    pairs: set[Pair] = set()
    for first, second in itertools.combinations(factors, 2):
        for a, b in itertools.product(first.values, second.values):
            if completable({first.name: a, second.name: b}, factors, allowed):
                pairs.add(((first.name, a), (second.name, b)))
    return pairs


def covered_pairs(row: Mapping[str, str], factors: Sequence[Factor]) -> set[Pair]:
    """The pairs one (complete) row covers, in `required_pairs`' orientation."""
    return {
        ((first.name, row[first.name]), (second.name, row[second.name]))
        for first, second in itertools.combinations(factors, 2)
    }


def pairwise(
    factors: Sequence[Factor],
    allowed: Allowed = _always,
    *,
    seed: int = 0,
    candidates: int = 16,
    required: set[Pair] | None = None,
) -> list[Row]:
    """A list of complete rows, each `allowed`, covering every pair of `required` (by default
    every pair `required_pairs` lists); a required pair no allowed row holds is an error."""
    names = [factor.name for factor in factors]
    if len(set(names)) != len(names):
        raise ValueError("factor names must be distinct")
    order = {name: index for index, name in enumerate(names)}
    generator = random.Random(seed)
    uncovered = set(required_pairs(factors, allowed) if required is None else required)
    rows: list[Row] = []
    while uncovered:
        # Sorted, so that a seed's table does not depend on set iteration order.
        pending = sorted(uncovered)
        best: Row | None = None
        best_gain = 0
        for _ in range(candidates):
            row = _candidate(factors, allowed, generator, pending, uncovered, order)
            if row is None:
                continue
            gain = len(covered_pairs(row, factors) & uncovered)
            if gain > best_gain:
                best, best_gain = row, gain
        if best is None:
            raise ValueError(f"no allowed row covers {pending[0]}")
        rows.append(best)
        uncovered -= covered_pairs(best, factors)
    return rows


def _candidate(
    factors: Sequence[Factor],
    allowed: Allowed,
    generator: random.Random,
    pending: list[Pair],
    uncovered: set[Pair],
    order: Mapping[str, int],
) -> Row | None:
    """One row grown from a random uncovered pair, every value chosen so that the row can still
    be completed; None when the pair itself cannot be."""
    (first, a), (second, b) = generator.choice(pending)
    row: Row = {first: a, second: b}
    if not completable(row, factors, allowed):
        return None
    rest = [factor for factor in factors if factor.name not in row]
    generator.shuffle(rest)
    for factor in rest:
        scored: list[tuple[int, float, str]] = []
        for value in factor.values:
            trial = {**row, factor.name: value}
            if not completable(trial, factors, allowed):
                continue
            gain = sum(
                1
                for name, fixed in row.items()
                if _oriented((name, fixed), (factor.name, value), order) in uncovered
            )
            # The random second key breaks ties between equally good values.
            scored.append((gain, generator.random(), value))
        row[factor.name] = max(scored)[2]
    return {factor.name: row[factor.name] for factor in factors}


def _oriented(x: tuple[str, str], y: tuple[str, str], order: Mapping[str, int]) -> Pair:
    return (x, y) if order[x[0]] < order[y[0]] else (y, x)


def full_product(factors: Sequence[Factor], allowed: Allowed = _always) -> Iterator[Row]:
    """Every allowed combination of every factor's values, in the factors' order."""
    for values in itertools.product(*(factor.values for factor in factors)):
        row = {factor.name: value for factor, value in zip(factors, values, strict=True)}
        if allowed(row):
            yield row
