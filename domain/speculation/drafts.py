"""Speculative decoding: the `--speculative-config` value and the history (n-gram) proposer."""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable
from dataclasses import dataclass

# vLLM's default window when neither prompt_lookup_min nor prompt_lookup_max is given.
DEFAULT_LOOKUP = 5
MAX_LOOKUP = 64


class SpeculativeMethod(enum.Enum):
    """Who proposes draft tokens: the request's own history, or a smaller draft model."""

    NGRAM = "ngram"
    DRAFT_MODEL = "draft_model"


class SpeculativeConfigError(ValueError):
    """`--speculative-config` is malformed; the server must not start with it."""


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """vLLM's `--speculative-config`: up to `num_speculative_tokens` drafts per round.

    ngram proposes from the request's prompt and output (suffix n-grams of `prompt_lookup_min`
    to `prompt_lookup_max` tokens); draft_model runs `model`, a smaller model with the same
    vocabulary.
    """

    method: SpeculativeMethod
    num_speculative_tokens: int
    prompt_lookup_min: int = DEFAULT_LOOKUP
    prompt_lookup_max: int = DEFAULT_LOOKUP
    model: str | None = None

    def __post_init__(self) -> None:
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise SpeculativeConfigError(
                f"num_speculative_tokens must be a positive integer, got {k!r}"
            )
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        if not 1 <= low <= high <= MAX_LOOKUP:
            raise SpeculativeConfigError(
                f"need 1 <= prompt_lookup_min <= prompt_lookup_max <= {MAX_LOOKUP}, "
                f"got {low} and {high}"
            )
        if (self.method is SpeculativeMethod.DRAFT_MODEL) != (self.model is not None):
            raise SpeculativeConfigError(
                "method draft_model needs `model` (a directory or GGUF file); ngram takes none"
            )

    def check_token_capacity(self, token_capacity: int) -> None:
        """A record carries one round's emitted tokens, so k <= T - 1."""
        if self.num_speculative_tokens > token_capacity - 1:
            raise SpeculativeConfigError(
                f"num_speculative_tokens {self.num_speculative_tokens} exceeds the completion "
                f"token capacity T = {token_capacity} minus one (a round emits up to k + 1)"
            )

    def to_json(self) -> str:
        """vLLM's JSON shape; `from_json` reads it back to an equal value."""
        fields: dict[str, object] = {
            "method": self.method.value,
            "num_speculative_tokens": self.num_speculative_tokens,
        }
        if self.method is SpeculativeMethod.NGRAM:
            fields.update(
                prompt_lookup_min=self.prompt_lookup_min, prompt_lookup_max=self.prompt_lookup_max
            )
        else:
            fields["model"] = self.model
        return json.dumps(fields)

    @classmethod
    def from_json(cls, text: str) -> SpeculativeConfig:
        """Parses vLLM's JSON shape, naming any unknown key or bad value."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as error:
            raise SpeculativeConfigError(f"--speculative-config is not JSON: {error}") from None
        if not isinstance(raw, dict):
            raise SpeculativeConfigError("--speculative-config must be a JSON object")
        known = {"method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"}
        unknown = sorted(set(raw) - known - {"model"})
        if unknown:
            raise SpeculativeConfigError(f"unknown --speculative-config keys: {unknown}")
        try:
            method = SpeculativeMethod(raw.get("method"))
        except ValueError:
            methods = ", ".join(m.value for m in SpeculativeMethod)
            raise SpeculativeConfigError(
                f"speculative method must be one of {methods}, got {raw.get('method')!r}"
            ) from None
        low, high = raw.get("prompt_lookup_min"), raw.get("prompt_lookup_max")
        for name, value in (("prompt_lookup_min", low), ("prompt_lookup_max", high)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise SpeculativeConfigError(f"{name} must be an integer, got {value!r}")
        # As vLLM: one given sets the other; neither gives the default window.
        low = low if low is not None else high if high is not None else DEFAULT_LOOKUP
        high = high if high is not None else low
        model = raw.get("model")
        if model is not None and not (isinstance(model, str) and model):
            raise SpeculativeConfigError(f"model must be a non-empty path, got {model!r}")
        k = raw.get("num_speculative_tokens")
        if isinstance(k, bool) or not isinstance(k, int):
            raise SpeculativeConfigError(
                f"num_speculative_tokens must be a positive integer, got {k!r}"
            )
        return cls(method, k, low, high, model)


class NgramProposer:
    """Proposes the tokens that followed the longest earlier occurrence of the current suffix.

    The history is the request's prompt and output. For every n in [min, max] an index maps
    each n-gram to where the token after its most recent occurrence stands; it grows by one
    entry per n as tokens arrive, so a proposal costs a few dictionary lookups whatever the
    history's length. The suffix itself is never its own earlier occurrence.
    """

    def __init__(self, min_n: int, max_n: int, history: Iterable[int] = ()) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n} and {max_n}")
        self._min_n = min_n
        self._max_n = max_n
        self._tokens: list[int] = []
        self._index: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(min_n, max_n + 1)
        }
        self.extend(history)

    def extend(self, tokens: Iterable[int]) -> None:
        """Appends tokens; each new token becomes the follower of the n-grams ending before it."""
        history = self._tokens
        for token_id in tokens:
            end = len(history)
            for n, index in self._index.items():
                if end >= n:
                    index[tuple(history[end - n : end])] = end
            history.append(token_id)

    def propose(self, limit: int) -> tuple[int, ...]:
        """Up to `limit` draft tokens, longest matching n-gram first; () without a match."""
        history = self._tokens
        if limit < 1:
            return ()
        for n in range(min(self._max_n, len(history)), self._min_n - 1, -1):
            follower = self._index[n].get(tuple(history[-n:]))
            if follower is not None:
                return tuple(history[follower : follower + limit])
        return ()


def next_draft_limit(limit: int, offered: int, accepted: int) -> int:
    """How many drafts to offer next: one more than stood last time, so a request whose
    proposals keep failing stops paying for long rejected runs (on a compute-bound device every
    verified row costs), and one whose proposals all stand grows back; k caps it."""
    if accepted == offered:
        return max(limit, offered) + 1
    return accepted + 1
