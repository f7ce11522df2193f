"""Implementations of the ports: torch model runner, tokenizers, HTTP, CLI."""
