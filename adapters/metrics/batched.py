"""Many observations of one Prometheus histogram in one pass."""

from __future__ import annotations

import bisect
import collections
from collections.abc import Sequence

from prometheus_client import Histogram

# Fewer values go through `observe` one by one: counting them first cost more (one-lane steps).
_COUNTED_FROM = 4


def observe_all(histogram: Histogram, values: Sequence[float]) -> None:
    """`histogram.observe(value)` for each of `values`, as one increment of each bucket they
    fall in and one of the sum.

    The engine observes every emitted token's inter-token time; in multiprocess mode each
    increment takes a lock and writes a memory-mapped file, two a value through `observe`:
    about 4% of the engine process's time at 64 streams (bench/host.py profile). A value
    falls in the first bucket whose upper bound is at least it, as `observe` places it;
    the sum may differ from the value-by-value one in its last bits (one float addition of
    their total instead of one per value). Reads the histogram's buckets and sum through
    prometheus_client's own attributes (`_upper_bounds`, `_buckets`, `_sum`), which
    tests/integration/metrics/test_batched_histogram.py holds to `observe`'s exposition.
    """
    if len(values) < _COUNTED_FROM:
        for value in values:
            histogram.observe(value)
        return
    histogram._raise_if_not_observable()
    bounds = histogram._upper_bounds
    counts = collections.Counter(bisect.bisect_left(bounds, value) for value in values)
    buckets = histogram._buckets
    for index, count in counts.items():
        buckets[index].inc(count)
    histogram._sum.inc(sum(values))
