"""Packs positions into the int32 layout the device writes, to test the host's reader."""

from __future__ import annotations

from domain.logprobs.values import NO_TOKEN, PositionLogprobs, float_to_bits


def pack_position(position: PositionLogprobs, width: int) -> list[int]:
    """The int32 words of a position: chosen ID and bits, then (ID, bits) pairs, -1 IDs after."""
    pairs = (width - 2) // 2
    if len(position.alternatives) > pairs:
        raise ValueError(f"{len(position.alternatives)} alternatives exceed {pairs} pairs")
    words = [position.chosen.token_id, float_to_bits(position.chosen.logprob)]
    for alternative in position.alternatives:
        words += [alternative.token_id, float_to_bits(alternative.logprob)]
    words += [NO_TOKEN, 0] * (pairs - len(position.alternatives))
    return words
