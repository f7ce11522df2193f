"""The shared commit rule: which sampled tokens a record emits, and why the request ends."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from domain.contract.records import Finish
from domain.engine.step import SlotWork


def emitted_prefix(
    sampled: Iterable[int], stop_ids: frozenset[int], remaining: int
) -> tuple[tuple[int, ...], Finish]:
    """The tokens a round emits, in order, and the finish it commits.

    Emission stops after the first stop token (emitted, finish STOP_TOKEN) or when the choice's
    remaining budget is used up (LENGTH); tokens after either are not emitted. `remaining`
    already counts `max_tokens` and the room left below `max_model_len`.
    """
    emitted: list[int] = []
    for token_id in sampled:
        emitted.append(token_id)
        if token_id in stop_ids:
            return tuple(emitted), Finish.STOP_TOKEN
        if len(emitted) >= remaining:
            return tuple(emitted), Finish.LENGTH
    return tuple(emitted), Finish.NONE


def commit_round(
    work: SlotWork, sampled: Sequence[int], accepted: int = 0
) -> tuple[tuple[int, ...], Finish, int]:
    """What every executor's commit writes for a sampling lane: `emitted_prefix` of its round,
    its finish, and the record's accepted drafts.

    `sampled` is the round's `accepted` drafts that stood, then the target's own token (the
    correction or the bonus). A stop token or the length limit inside that run clips drafts
    too, and only the drafts the round emits count as accepted: metrics never count more
    accepted drafts than tokens emitted.
    """
    if not 0 <= accepted < max(len(sampled), 1):
        raise ValueError(f"{accepted} accepted drafts in a round of {len(sampled)} tokens")
    emitted, finish = emitted_prefix(sampled, work.sampling.stop_token_ids, work.sampling.remaining)
    return emitted, finish, min(accepted, len(emitted))


def forced_round(work: SlotWork) -> tuple[tuple[int, ...], Finish, int]:
    """What a lane with a forced token commits: that token alone under the same stop and length
    rules, and the forced mask that marks it (bit 0, the record's first token)."""
    if work.forced_token is None:
        raise ValueError("the lane has no forced token")
    emitted, finish = emitted_prefix(
        (work.forced_token,), work.sampling.stop_token_ids, work.sampling.remaining
    )
    return emitted, finish, 1
