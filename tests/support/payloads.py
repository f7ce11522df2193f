"""Two JSON documents equal but for floats within a rounding tolerance (and keys left out)."""

from __future__ import annotations


def assert_payloads_agree(
    left: object,
    right: object,
    tolerance: float,
    *,
    skipped: frozenset[str] = frozenset(),
    where: str = "$",
) -> None:
    """Raises unless the documents match in structure, key order and every non-float value,
    and their floats differ by at most `tolerance`; keys in `skipped` are not compared."""
    if isinstance(left, float) and isinstance(right, float):
        assert abs(left - right) <= tolerance, (where, left, right)
    elif isinstance(left, dict) and isinstance(right, dict):
        assert list(left) == list(right), where
        for key in left:
            if key not in skipped:
                assert_payloads_agree(
                    left[key], right[key], tolerance, skipped=skipped, where=f"{where}.{key}"
                )
    elif isinstance(left, list) and isinstance(right, list):
        assert len(left) == len(right), where
        for index, (one, other) in enumerate(zip(left, right, strict=True)):
            assert_payloads_agree(one, other, tolerance, skipped=skipped, where=f"{where}[{index}]")
    else:
        assert left == right, (where, left, right)
