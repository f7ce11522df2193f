"""The layering holds: import-linter keeps every contract and domain/ports import stdlib only."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
STDLIB = frozenset(sys.stdlib_module_names)


@dataclass(frozen=True)
class _Import:
    line: int
    root: str
    type_only: bool


def _is_type_checking_guard(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class _ImportCollector(ast.NodeVisitor):
    """Collects every absolute import of a module, noting those under `if TYPE_CHECKING:`."""

    def __init__(self) -> None:
        self.found: list[_Import] = []
        self._type_only_depth = 0

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(node.lineno, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        # Relative imports cannot leave the package being scanned.
        if node.level == 0 and node.module:
            self._add(node.lineno, node.module)

    def visit_If(self, node: ast.If) -> None:
        if not _is_type_checking_guard(node):
            self.generic_visit(node)
            return
        self._type_only_depth += 1
        for child in node.body:
            self.visit(child)
        self._type_only_depth -= 1
        for child in node.orelse:
            self.visit(child)

    def _add(self, line: int, dotted: str) -> None:
        root = dotted.partition(".")[0]
        self.found.append(_Import(line, root, type_only=self._type_only_depth > 0))


def _foreign_imports(
    package_dir: Path, allowed: frozenset[str], allowed_type_only: frozenset[str]
) -> list[str]:
    """Return `path:line imports name` for each import of the package outside what is allowed.

    `allowed_type_only` widens `allowed` for imports under `if TYPE_CHECKING:`.
    """
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        collector = _ImportCollector()
        collector.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        shown = path.relative_to(package_dir.parent).as_posix()
        for imported in collector.found:
            permitted = allowed | allowed_type_only if imported.type_only else allowed
            if imported.root not in permitted:
                kind = "imports (type only)" if imported.type_only else "imports"
                found.append(f"{shown}:{imported.line} {kind} {imported.root}")
    return found


def _run_lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    if not LINT_IMPORTS.exists():
        pytest.fail(f"lint-imports is not installed next to {sys.executable}; run `make venv`")
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_domain_imports_only_the_standard_library_and_names_ports_only_for_type_checking() -> None:
    # The domain drives ports, but ports import domain values, so a run-time import is a cycle.
    foreign = _foreign_imports(
        REPO_ROOT / "domain", STDLIB | {"domain"}, allowed_type_only=frozenset({"ports"})
    )
    assert not foreign, "domain must stay stdlib-only:\n" + "\n".join(foreign)


def test_ports_import_only_the_standard_library_and_the_domain() -> None:
    foreign = _foreign_imports(
        REPO_ROOT / "ports", STDLIB | {"domain", "ports"}, allowed_type_only=frozenset()
    )
    assert not foreign, "ports may import only stdlib and domain:\n" + "\n".join(foreign)


def test_foreign_import_scan_reports_file_and_line_of_each_offender(tmp_path: Path) -> None:
    package_dir = tmp_path / "domain"
    (package_dir / "inner").mkdir(parents=True)
    (package_dir / "clean.py").write_text("import os\nfrom . import sibling\nimport domain.x\n")
    (package_dir / "inner" / "leaky.py").write_text(
        "from __future__ import annotations\nfrom numpy import array\n\n"
        "def f():\n    import torch.nn\n"
    )
    found = _foreign_imports(package_dir, STDLIB | {"domain"}, allowed_type_only=frozenset())
    assert found == [
        "domain/inner/leaky.py:2 imports numpy",
        "domain/inner/leaky.py:5 imports torch",
    ]


def test_foreign_import_scan_widens_only_what_type_checking_blocks_import(tmp_path: Path) -> None:
    package_dir = tmp_path / "domain"
    package_dir.mkdir()
    (package_dir / "typed.py").write_text(
        "import typing\n"
        "if typing.TYPE_CHECKING:\n    import ports.tokenizer\n    import torch\n"
        "else:\n    import ports\n"
    )
    found = _foreign_imports(package_dir, STDLIB, allowed_type_only=frozenset({"ports"}))
    assert found == [
        "domain/typed.py:4 imports (type only) torch",
        "domain/typed.py:6 imports ports",
    ]


def test_every_layering_contract_is_configured() -> None:
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    linter = config["tool"]["importlinter"]
    contracts = {contract["id"]: contract for contract in linter["contracts"]}
    assert linter["include_external_packages"] is True
    assert contracts["layers"]["layers"] == ["adapters", "ports", "domain"]
    inside = contracts["domain-packages"]
    assert inside["type"] == "layers" and inside["containers"] == ["domain"]
    assert inside["exhaustive"] is True
    assert contracts["domain-acyclic"]["type"] == "acyclic_siblings"
    assert contracts["domain-acyclic"]["ancestors"] == ["domain"]
    for contract_id in ("domain-stdlib-only", "ports-domain-only"):
        forbidden = set(contracts[contract_id]["forbidden_modules"])
        assert {"adapters", "torch", "numpy", "falcon", "transformers"} <= forbidden


def test_import_linter_keeps_every_contract_on_this_tree() -> None:
    result = _run_lint_imports(REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def _domain_layers() -> list[list[str]]:
    """The domain's packages, top layer first, as the `domain-packages` contract orders them."""
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = {c["id"]: c for c in config["tool"]["importlinter"]["contracts"]}
    return [
        [name.strip() for name in layer.split("|")]
        for layer in contracts["domain-packages"]["layers"]
    ]


def test_import_linter_breaks_contracts_on_a_tree_that_violates_them(tmp_path: Path) -> None:
    # Guards against contracts that silently match nothing, e.g. externals left out of the graph.
    (tmp_path / "pyproject.toml").write_bytes((REPO_ROOT / "pyproject.toml").read_bytes())
    stand_ins = ["domain", "ports", "adapters"]
    stand_ins += [f"domain/{name}" for layer in _domain_layers() for name in layer]
    for package in stand_ins:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text('"""Stand-in package."""\n')
    domain = tmp_path / "domain"
    (domain / "common" / "leaky.py").write_text("import numpy\nfrom ports import executor\n")
    (tmp_path / "ports" / "executor.py").write_text("from adapters import gpu\n")
    (domain / "common" / "typed.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ports import executor\n"
    )
    # A lower package reaching up, two siblings of one layer, and a circle inside one package.
    (domain / "engine" / "step.py").write_text('"""Stand-in."""\n')
    (domain / "emission" / "upward.py").write_text("from domain.engine import step\n")
    (domain / "parsers" / "sideways.py").write_text("from domain.engine import step\n")
    (domain / "structured" / "first.py").write_text("from domain.structured import second\n")
    (domain / "structured" / "second.py").write_text("from domain.structured import first\n")
    # A module at the top of the domain belongs to no package, so no layer.
    (domain / "stray.py").write_text('"""Stand-in."""\n')
    result = _run_lint_imports(tmp_path)
    assert result.returncode != 0, result.stdout
    assert "domain.common.typed" not in result.stdout
    for chain in (
        "domain.common.leaky -> numpy",
        "domain.common.leaky -> ports",
        "ports.executor -> adapters",
        "domain.emission.upward -> domain.engine.step",
        "domain.parsers.sideways -> domain.engine.step",
        "No cycles are allowed in domain.structured",
        "domain.stray",
    ):
        assert chain in result.stdout
