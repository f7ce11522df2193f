"""Where metrics live: a private registry per app, or prometheus_client's multiprocess files."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import (
    CONTENT_TYPE_PLAIN_0_0_4,
    CollectorRegistry,
    generate_latest,
    multiprocess,
    values,
)
from prometheus_client.metrics_core import Metric

# prometheus_client reads this variable when it is first imported: set, every metric value lives
# in per-process files under it, so any process can expose the values of all of them.
MULTIPROCESS_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4


@dataclass(frozen=True)
class MetricsRegistry:
    """`owner` registers the metric objects; a scrape collects `exposed`.

    In one process they are the same registry. In multiprocess mode the metric objects write
    their files wherever they are registered, and `exposed` merges every process's files.
    """

    owner: CollectorRegistry
    exposed: CollectorRegistry

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> MetricsRegistry:
        directory = environ.get(MULTIPROCESS_VARIABLE)
        if not directory:
            owner = CollectorRegistry()
            exposed = CollectorRegistry()
            exposed.register(_WithoutCreated(owner))
            return cls(owner, exposed)
        exposed = CollectorRegistry()
        multiprocess.MultiProcessCollector(exposed, path=directory)
        return cls(CollectorRegistry(), exposed)

    def render(self) -> bytes:
        """The Prometheus text format (version 0.0.4) of every metric."""
        return generate_latest(self.exposed)


class _WithoutCreated:
    """Collects a registry without its `*_created` samples.

    vLLM exports none (multiprocess files carry none either); prometheus_client's own switch for
    them is process-wide state, and this app keeps its metrics state per instance.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for metric in self._registry.collect():
            kept = Metric(metric.name, metric.documentation, metric.type, metric.unit)
            kept.samples = [s for s in metric.samples if not s.name.endswith("_created")]
            yield kept


def clear_multiprocess_directory(environ: Mapping[str, str] = os.environ) -> None:
    """Removes a previous run's value files, so counters start from zero (before workers fork)."""
    directory = environ.get(MULTIPROCESS_VARIABLE)
    if directory:
        for stale in Path(directory).glob("*.db"):
            stale.unlink()


def enable_multiprocess(directory: str) -> None:
    """Puts this process, and every process it starts or forks from now on, in multiprocess
    mode with its files in `directory`. prometheus_client picks its value class when it is
    first imported, which has happened by now, so the choice is made again here; metric
    objects made from now on write files."""
    os.environ[MULTIPROCESS_VARIABLE] = directory
    values.ValueClass = values.get_value_class()


def forget_process(pid: int) -> None:
    """Drops a dead worker's live gauges from the multiprocess files (gunicorn `child_exit`)."""
    if os.environ.get(MULTIPROCESS_VARIABLE):
        multiprocess.mark_process_dead(pid)
