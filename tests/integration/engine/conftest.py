"""Fixtures: one tiny model directory per test session, and engines built over it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.tiny_serving import build_tiny_model_dir


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny-llama"))
