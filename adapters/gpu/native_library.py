"""Loading one of our compiled C libraries through ctypes, unless it is switched off or unbuilt."""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

INT64, POINTER, INT, FLOAT = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_float
# A function's argument types and its result type (None: void).
Signature = tuple[Sequence[Any], Any]


def load_native(path: Path, switch: str, signatures: Mapping[str, Signature]) -> ctypes.CDLL | None:
    """The library at `path` with each function of `signatures` declared, or None when the
    environment sets `switch` to "0" or `make` has not built it: each caller then runs its
    torch fallback. Calls into a CDLL release the GIL while they run."""
    if os.environ.get(switch, "1") == "0" or not path.is_file():
        return None
    loaded = ctypes.CDLL(str(path))
    for name, (arguments, result) in signatures.items():
        function = getattr(loaded, name)
        function.argtypes = list(arguments)
        function.restype = result
    return loaded


def cached_loader(
    path: Path, switch: str, signatures: Mapping[str, Signature]
) -> Callable[[], ctypes.CDLL | None]:
    """A function that loads the library (`load_native`) on its first call and answers that
    same library, or None, on every later one."""
    return functools.cache(functools.partial(load_native, path, switch, signatures))
