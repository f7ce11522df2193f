"""The family tests' checkpoints: a module names its family in FAMILY (or parametrizes the
`family` fixture), these fixtures build it once a module."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support import family_checks as checks


@pytest.fixture(scope="module")
def family(request: pytest.FixtureRequest) -> checks.Family:
    """The checks.FAMILIES entry the module names in FAMILY."""
    return checks.FAMILIES[request.module.FAMILY]


@pytest.fixture(scope="module")
def family_dir(family: checks.Family, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The family's float32 checkpoint, once a module."""
    return family.checkpoint(tmp_path_factory.mktemp(f"{family.name}-f32"), torch.float32)


@pytest.fixture(scope="module")
def family_reference(family_dir: Path) -> torch.nn.Module:
    """transformers' float32 model of `family_dir`."""
    return checks.reference_model(family_dir)
