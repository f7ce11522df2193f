"""The type of the JSON objects presentation builds for the HTTP adapter to serialize."""

from __future__ import annotations

from typing import Any, TypeAlias

# Values are JSON: str, int, float, bool, None, lists and objects of those.
JsonObject: TypeAlias = dict[str, Any]
