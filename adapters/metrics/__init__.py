"""Prometheus metrics: the engine observer, rejection counts and the text exposition."""
