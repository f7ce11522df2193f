"""Reading one GGUF metadata key, with a default or a clear error when it is absent."""

from __future__ import annotations

from typing import Any

# Stands for "no default": an absent key is then an error.
MISSING: Any = object()


def field(reader: Any, key: str, default: Any = MISSING) -> Any:
    """The contents of metadata `key` of a gguf-py reader; `default` when absent, or ValueError."""
    found = reader.fields.get(key)
    if found is None:
        if default is MISSING:
            raise ValueError(f"GGUF metadata has no {key!r}")
        return default
    return found.contents()
