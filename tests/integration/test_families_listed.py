"""The README and `helios serve --help` list exactly the architectures the config table serves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from adapters.cli.families import readme_block, rewrite_readme
from adapters.cli.main import main
from adapters.gpu.model.config import SUPPORTED_ARCHITECTURES

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_lists_the_supported_architectures_as_the_table_has_them() -> None:
    readme = README.read_text(encoding="utf-8")
    assert readme_block() in readme, "run `python -m adapters.cli.families README.md`"
    listed = re.findall(r"^- `(\w+)`$", readme_block(), re.MULTILINE)
    assert listed == sorted(SUPPORTED_ARCHITECTURES)
    assert rewrite_readme(readme) == readme


def test_serve_help_names_every_supported_architecture(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as finished:
        main(["serve", "--help"])
    assert finished.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "architectures served: " + ", ".join(sorted(SUPPORTED_ARCHITECTURES)) in help_text
