"""One choice's sampling, fixed at admission, and the sampling part of each of its lanes."""

from __future__ import annotations

from dataclasses import dataclass

from domain.common.frozen import quick_init
from domain.logprobs.values import LogprobOptions
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams


@quick_init
@dataclass(frozen=True, slots=True)
class LaneSampling:
    """How a lane draws: its request's parameters and the choice's seed; and, when it samples,
    how its choice ends: with STOP_TOKEN when it emits one of `stop_token_ids`, with LENGTH when
    `remaining` reaches zero. `banned_token_ids` cannot be sampled (min_tokens); `logprobs` asks
    for the sampled tokens' entries."""

    params: SamplingParams
    seed: int
    stop_token_ids: frozenset[int] = frozenset()
    banned_token_ids: tuple[int, ...] = ()
    remaining: int = 1
    logprobs: LogprobOptions | None = None

    def __post_init__(self) -> None:
        if self.remaining < 1:
            raise ValueError("a lane needs a remaining budget of at least one token")


@dataclass(frozen=True, slots=True)
class ChoiceSampling:
    """How a choice draws its tokens and when it ends, fixed at admission: at `max_tokens`
    outputs, or at one of `stop_token_ids`; `banned_until_min_tokens` cannot be sampled before
    `params.min_tokens` outputs."""

    params: SamplingParams
    seed: int
    max_tokens: int
    stop_token_ids: frozenset[int] = frozenset()
    banned_until_min_tokens: tuple[int, ...] = ()
    logprobs: LogprobOptions | None = None

    @classmethod
    def admit(
        cls,
        request: EngineRequest,
        index: int,
        fallback_seed: int,
        eos_token_ids: frozenset[int],
        max_model_len: int,
    ) -> ChoiceSampling:
        """Choice `index` of an admitted request: its seed, and at most `max_tokens` outputs
        within `max_model_len` (none for a prefill-only request)."""
        params, constrained = request.params, request.grammar is not None
        limit = max_model_len - len(request.prompt_token_ids)
        max_tokens = limit if params.max_tokens is None else min(params.max_tokens, limit)
        return cls(
            params,
            request.choice_seed(index, fallback_seed),
            0 if request.prefill_only else max_tokens,
            stop_token_ids(params, eos_token_ids, constrained=constrained),
            min_tokens_ban(params, eos_token_ids, constrained=constrained),
            request.options,
        )

    def lane(self, emitted: int, sample: bool) -> LaneSampling:
        """The lane part after `emitted` outputs; only a sampling lane asks for logprobs."""
        banned = self.banned_until_min_tokens if emitted < self.params.min_tokens else ()
        remaining = max(self.max_tokens - emitted, 1)
        logprobs = self.logprobs if sample else None
        return LaneSampling(
            self.params, self.seed, self.stop_token_ids, banned, remaining, logprobs
        )


def stop_token_ids(
    params: SamplingParams, eos_token_ids: frozenset[int], *, constrained: bool = False
) -> frozenset[int]:
    """Tokens whose emission ends a choice: `stop_token_ids`, and EOS unless `ignore_eos`.

    A constrained choice's grammar allows EOS only once its output is complete, and then EOS
    ends it, `ignore_eos` or not: nothing may follow a complete output.
    """
    stops = frozenset(params.stop_token_ids)
    return stops if params.ignore_eos and not constrained else stops | eos_token_ids


def min_tokens_ban(
    params: SamplingParams, eos_token_ids: frozenset[int], *, constrained: bool = False
) -> tuple[int, ...]:
    """Tokens that cannot be sampled until `min_tokens` are generated: every stop token and
    EOS (also under `ignore_eos`, as vLLM bans it), ascending.

    None for a constrained choice: its grammar decides where the output ends, and a ban could
    leave a complete output no token to end with.
    """
    if constrained:
        return ()
    return tuple(sorted(frozenset(params.stop_token_ids) | eos_token_ids))
