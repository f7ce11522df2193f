"""The model families served, as `--help` and the README list them, from the one table.

`python -m adapters.cli.families README.md` rewrites the README's list after the table changes;
tests/integration/test_families_listed.py holds both to the table.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from adapters.gpu.model.config import SUPPORTED_ARCHITECTURES

README_START = "<!-- families: written by `python -m adapters.cli.families README.md` -->"
README_END = "<!-- /families -->"
_BLOCK = re.compile(re.escape(README_START) + r".*?" + re.escape(README_END), re.DOTALL)


def architectures() -> list[str]:
    """The `architectures` values of `config.json` that load, sorted."""
    return sorted(SUPPORTED_ARCHITECTURES)


def help_text() -> str:
    """The list as the `MODEL` help shows it."""
    return ", ".join(architectures())


def readme_block() -> str:
    """The README's list, between its markers."""
    items = "".join(f"- `{name}`\n" for name in architectures())
    heading = "Model families served (`architectures` in `config.json`):"
    return f"{README_START}\n{heading}\n\n{items}{README_END}"


def rewrite_readme(readme: str) -> str:
    """`readme` with its list replaced by the current one; ValueError without the markers."""
    if _BLOCK.search(readme) is None:
        raise ValueError(f"the README has no {README_START} ... {README_END} block")
    return _BLOCK.sub(lambda match: readme_block(), readme, count=1)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m adapters.cli.families README.md", file=sys.stderr)
        return 2
    path = Path(argv[0])
    path.write_text(rewrite_readme(path.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
