"""The rule for a request's `cache_salt`: a non-empty string of at most 256 UTF-8 bytes."""

from __future__ import annotations

from domain.common.errors import InvalidRequestError

CACHE_SALT_MAX_BYTES = 256


def check_cache_salt(salt: object) -> None:
    """Refuses a salt that is not a non-empty string of at most CACHE_SALT_MAX_BYTES bytes (a
    400 naming `cache_salt`); None (no salt) passes."""
    if salt is None:
        return
    if not isinstance(salt, str) or not salt:
        raise InvalidRequestError("`cache_salt` must be a non-empty string", param="cache_salt")
    if len(salt.encode("utf-8", "surrogatepass")) > CACHE_SALT_MAX_BYTES:
        raise InvalidRequestError(
            f"`cache_salt` must be at most {CACHE_SALT_MAX_BYTES} bytes of UTF-8",
            param="cache_salt",
        )
