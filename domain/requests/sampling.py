"""Sampling settings of one request, validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from domain.common.errors import InvalidRequestError
from domain.common.ranges import MIN_TOKENS, SEED, TOKEN_BUDGET, TOKEN_ID, TOP_K

MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_LOGIT_BIAS_ENTRIES = 300


def _require(condition: bool, message: str, param: str) -> None:
    if not condition:
        raise InvalidRequestError(message, param=param)


def _finite(value: float, param: str) -> None:
    _require(
        isinstance(value, (int, float)) and math.isfinite(value),
        f"{param} must be a finite number",
        param,
    )


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How tokens are chosen and when generation stops; defaults follow vLLM.

    `max_tokens=None` means "up to the model length". `top_k` of 0 or -1 disables top-k.
    `logit_bias` is a tuple of (token_id, bias) pairs added to the logits before sampling.
    Integer fields keep to the ranges of `domain.common.ranges`.
    """

    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    min_tokens: int = 0
    logit_bias: tuple[tuple[int, float], ...] = field(default=())

    def __post_init__(self) -> None:
        self._check_integers()
        _finite(self.temperature, "temperature")
        _require(self.temperature >= 0.0, "temperature must be non-negative", "temperature")
        _finite(self.top_p, "top_p")
        _require(0.0 < self.top_p <= 1.0, "top_p must be in (0, 1]", "top_p")
        _finite(self.min_p, "min_p")
        _require(0.0 <= self.min_p <= 1.0, "min_p must be in [0, 1]", "min_p")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _finite(value, name)
            _require(-2.0 <= value <= 2.0, f"{name} must be in [-2, 2]", name)
        _finite(self.repetition_penalty, "repetition_penalty")
        _require(
            0.0 < self.repetition_penalty <= 2.0,
            "repetition_penalty must be in (0, 2]",
            "repetition_penalty",
        )
        self._check_stops()
        if self.max_tokens is not None:
            _require(
                self.min_tokens <= self.max_tokens,
                "min_tokens must not exceed max_tokens",
                "min_tokens",
            )
        self._check_logit_bias()

    def _check_integers(self) -> None:
        # Ranges first: the rules after them may quote a value, which is then of bounded size.
        if self.max_tokens is not None:
            TOKEN_BUDGET.check(self.max_tokens, "max_tokens")
        TOP_K.check(self.top_k, "top_k")
        if self.seed is not None:
            SEED.check(self.seed, "seed")
        MIN_TOKENS.check(self.min_tokens, "min_tokens")
        TOKEN_ID.check_each(self.stop_token_ids, "stop_token_ids")
        for token_id, _ in self.logit_bias:
            TOKEN_ID.check(token_id, "logit_bias", subject="each key of `logit_bias`")

    def _check_stops(self) -> None:
        _require(
            len(self.stop) <= MAX_STOP_STRINGS,
            f"at most {MAX_STOP_STRINGS} stop strings are allowed",
            "stop",
        )
        for stop in self.stop:
            _require(
                0 < len(stop) <= MAX_STOP_STRING_CHARS,
                f"each stop string must have 1 to {MAX_STOP_STRING_CHARS} characters",
                "stop",
            )

    def _check_logit_bias(self) -> None:
        _require(
            len(self.logit_bias) <= MAX_LOGIT_BIAS_ENTRIES,
            f"logit_bias may have at most {MAX_LOGIT_BIAS_ENTRIES} entries",
            "logit_bias",
        )
        for _, bias in self.logit_bias:
            _finite(bias, "logit_bias")
            _require(
                -100.0 <= bias <= 100.0, "logit_bias values must be in [-100, 100]", "logit_bias"
            )

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def uses_penalties(self) -> bool:
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
        )

    def check_token_ids(self, vocab_size: int) -> None:
        """Token IDs named by the request must exist in the vocabulary."""
        for token_id in self.stop_token_ids:
            _require(
                token_id < vocab_size,
                f"stop token {token_id} is outside the vocabulary",
                "stop_token_ids",
            )
        for token_id, _ in self.logit_bias:
            _require(
                token_id < vocab_size,
                f"logit_bias token {token_id} is outside the vocabulary",
                "logit_bias",
            )
