"""`observe_all` shows what one `observe` per value shows: the same buckets, count and sum."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from adapters.metrics.batched import observe_all
from adapters.metrics.prometheus import INTER_TOKEN_LATENCY_BUCKETS
from tests.support.prometheus import Scrape

NAME = "vllm:inter_token_latency_seconds"
# Every bound itself (a value equal to a bound is in that bucket), between them, beyond the last.
EDGES = [*INTER_TOKEN_LATENCY_BUCKETS, 0.0, 1e-9, 0.0251, 1e6]


def _scrape(fill) -> Scrape:
    registry = CollectorRegistry()
    histogram = Histogram(
        NAME, "test", ["model_name"], registry=registry, buckets=INTER_TOKEN_LATENCY_BUCKETS
    ).labels("tiny")
    fill(histogram)
    return Scrape(generate_latest(registry).decode("utf-8"))


def _shown(found: Scrape) -> tuple[list[float], float, float]:
    buckets = [
        found.value(f"{NAME}_bucket", model_name="tiny", le=le)
        for le in (*(repr(float(b)) for b in INTER_TOKEN_LATENCY_BUCKETS), "+Inf")
    ]
    return (
        buckets,
        found.value(f"{NAME}_count", model_name="tiny"),
        found.value(f"{NAME}_sum", model_name="tiny"),
    )


@given(st.lists(st.one_of(st.sampled_from(EDGES), st.floats(0, 100)), max_size=80))
def test_many_values_at_once_show_as_one_observation_each(values):
    def one_by_one(histogram):
        for value in values:
            histogram.observe(value)

    buckets, count, total = _shown(_scrape(lambda histogram: observe_all(histogram, values)))
    expected_buckets, expected_count, expected_total = _shown(_scrape(one_by_one))

    assert buckets == expected_buckets
    assert count == expected_count == len(values)
    assert total == pytest.approx(expected_total, rel=1e-12, abs=1e-12)


def test_a_labelled_parent_is_refused_as_observe_refuses_it():
    parent = Histogram(NAME, "test", ["model_name"], registry=CollectorRegistry())

    with pytest.raises(ValueError):
        observe_all(parent, [0.1])
