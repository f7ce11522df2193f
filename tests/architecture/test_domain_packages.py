"""The domain is a set of packages, and each package's docstring says what it owns."""

from __future__ import annotations

import ast
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def _package_faults(domain_dir: Path) -> list[str]:
    """Return one line for each module outside a package and each package without a plain face.

    A package's face is its `__init__.py`: one docstring of a single paragraph, and nothing
    else, so importing a package does no work and hands on no names.
    """
    faults = [
        f"{path.name}: a module at the top of the domain belongs to no package"
        for path in sorted(domain_dir.glob("*.py"))
        if path.name != "__init__.py"
    ]
    for package in sorted(p for p in domain_dir.iterdir() if p.is_dir()):
        if package.name == "__pycache__":
            continue
        face = package / "__init__.py"
        if not face.is_file():
            faults.append(f"{package.name}: no __init__.py")
            continue
        tree = ast.parse(face.read_text(encoding="utf-8"), filename=str(face))
        docstring = ast.get_docstring(tree)
        if not docstring:
            faults.append(f"{package.name}: no docstring saying what it owns")
        elif "\n\n" in docstring:
            faults.append(f"{package.name}: the docstring is more than one paragraph")
        if len(tree.body) != (1 if docstring else 0):
            faults.append(f"{package.name}: __init__.py does more than carry its docstring")
    return faults


def test_every_domain_module_lives_in_a_package_whose_face_is_one_paragraph() -> None:
    faults = _package_faults(REPO_ROOT / "domain")
    assert not faults, "\n".join(faults)


def test_package_check_names_strays_bare_packages_and_busy_faces(tmp_path: Path) -> None:
    domain = tmp_path / "domain"
    for name in ("kept", "bare", "busy", "long", "faceless"):
        (domain / name).mkdir(parents=True)
    (domain / "__init__.py").write_text('"""The domain."""\n')
    (domain / "stray.py").write_text('"""A stray."""\n')
    (domain / "kept" / "__init__.py").write_text('"""What it owns, in one paragraph."""\n')
    (domain / "bare" / "__init__.py").write_text("")
    (domain / "busy" / "__init__.py").write_text('"""Owns a lot."""\n\nfrom os import path\n')
    (domain / "long" / "__init__.py").write_text('"""One.\n\nTwo."""\n')
    assert _package_faults(domain) == [
        "stray.py: a module at the top of the domain belongs to no package",
        "bare: no docstring saying what it owns",
        "busy: __init__.py does more than carry its docstring",
        "faceless: no __init__.py",
        "long: the docstring is more than one paragraph",
    ]
