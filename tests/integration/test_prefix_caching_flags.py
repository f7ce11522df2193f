"""`helios serve` and `helios generate` take vLLM's prefix-caching flags: on by default."""

from __future__ import annotations

import argparse

import pytest

from adapters.cli import generate, serve
from adapters.cli.runner_args import engine_config, prefix_caching


def parsed(command, *flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers(dest="command"))
    required = ["--prompt", "hi"] if command is generate else []
    return parser.parse_args([command.__name__.rsplit(".", 1)[1], *required, *flags])


@pytest.mark.parametrize("command", [serve, generate])
def test_the_cache_is_on_with_sha256_unless_turned_off(command):
    assert prefix_caching(parsed(command)) == "sha256"
    assert prefix_caching(parsed(command, "--enable-prefix-caching")) == "sha256"
    assert prefix_caching(parsed(command, "--prefix-caching-hash-algo", "blake2b")) == "blake2b"
    assert prefix_caching(parsed(command, "--no-enable-prefix-caching")) is None


def test_generate_s_engine_gets_the_choice():
    assert engine_config(parsed(generate, "--no-enable-prefix-caching")).prefix_caching is None


def test_an_unknown_hash_algorithm_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        parsed(serve, "--prefix-caching-hash-algo", "md5")

    assert "md5" in capsys.readouterr().err
