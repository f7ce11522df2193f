"""Reads a Prometheus text exposition into samples a test can look up by name and labels."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


class Scrape:
    """Every sample of one scrape; parsing fails loudly on anything the text format forbids."""

    def __init__(self, text: str) -> None:
        self.families = {family.name: family for family in text_string_to_metric_families(text)}
        self._values = {
            (sample.name, frozenset(sample.labels.items())): sample.value
            for family in self.families.values()
            for sample in family.samples
        }

    def value(self, name: str, **labels: str) -> float:
        """The sample `name` with exactly these labels; KeyError when there is none."""
        return self._values[name, frozenset(labels.items())]

    def names(self) -> set[str]:
        return {name for name, _ in self._values}

    def buckets(self, name: str, **labels: str) -> dict[str, float]:
        """A histogram's cumulative bucket counts by their `le` bound."""
        wanted = set(labels.items())
        return {
            dict(key)["le"]: value
            for (sample, key), value in self._values.items()
            if sample == f"{name}_bucket" and wanted <= set(key)
        }
