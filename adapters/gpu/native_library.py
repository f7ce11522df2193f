"""Loading one of our compiled C libraries through ctypes, unless it is switched off or unbuilt."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path


def load_native(path: Path, switch: str) -> ctypes.CDLL | None:
    """The library at `path`, or None when the environment sets `switch` to "0" or `make`
    has not built it: each caller then runs its torch fallback. Calls into a CDLL release
    the GIL while they run."""
    if os.environ.get(switch, "1") == "0" or not path.is_file():
        return None
    return ctypes.CDLL(str(path))
