"""The family tests' checkpoints: a module names its `family` fixture, these build from it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support import family_checks as checks


@pytest.fixture(scope="module")
def family_dir(family: checks.Family, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The family's float32 checkpoint, once a module."""
    return family.checkpoint(tmp_path_factory.mktemp(f"{family.name}-f32"), torch.float32)


@pytest.fixture(scope="module")
def family_reference(family_dir: Path) -> torch.nn.Module:
    """transformers' float32 model of `family_dir`."""
    return checks.reference_model(family_dir)
