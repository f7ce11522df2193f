"""Which logprob requests get a 400: the one rule, checked once per request before admission."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from domain.common.errors import InvalidRequestError
from domain.common.ranges import TOKEN_ID, check_logprob_count
from domain.logprobs.values import MAX_SELECTED_IDS, NATURAL_TOP_K, LogprobOptions

# The one `include` value of the Responses API that asks for output-text logprobs.
OUTPUT_TEXT_LOGPROBS = "message.output_text.logprobs"


@dataclass(frozen=True, slots=True)
class LogprobAsk:
    """A request's logprob fields as the API spelled them (HTTP only translates JSON types).

    `wanted`: logprobs were asked for at all (completions: `logprobs` present; chat:
    `logprobs: true`). `count`: the alternatives asked for, completions' `logprobs` or chat's
    `top_logprobs` as `count_param` names it. `token_ids`: `logprob_token_ids`, None when
    absent. `prompt_logprobs`: vLLM's extra, None when absent.
    """

    wanted: bool = False
    count: int | None = None
    count_param: str = "logprobs"
    token_ids: tuple[int, ...] | None = None
    echo: bool = False
    stream: bool = False
    prompt_logprobs: int | None = None

    @property
    def options(self) -> LogprobOptions | None:
        """What each generated position reports, or None when no logprobs were asked for."""
        if not self.wanted:
            return None
        return LogprobOptions(top_k=self.count or 0, token_ids=self.token_ids or ())

    @property
    def echoes(self) -> bool:
        """Echoed prompt tokens carry entries (the first one null)."""
        return self.echo and self.wanted

    @property
    def prompt_top_k(self) -> int | None:
        """Alternatives each prompt position is scored for; None when the prompt is not scored.

        As in vLLM, echo with `logprobs` scores the prompt at the `logprobs` count unless
        `prompt_logprobs` says otherwise."""
        if self.prompt_logprobs is not None:
            return self.prompt_logprobs
        return (self.count or 0) if self.echoes else None


NO_LOGPROBS_ASKED = LogprobAsk()


def responses_include(include: Sequence[str]) -> bool:
    """Whether a Responses `include` asks for logprobs; any value but the output text's
    logprobs is a 400 [`include`]."""
    other = [value for value in include if value != OUTPUT_TEXT_LOGPROBS]
    if other:
        raise InvalidRequestError(
            f"`include` value {other[0]!r} is not served; only {OUTPUT_TEXT_LOGPROBS!r} is",
            param="include",
        )
    return bool(include)


def responses_logprob_ask(
    wanted: bool, count: int | None, token_ids: tuple[int, ...] | None
) -> LogprobAsk:
    """A Responses request's logprob fields as a LogprobAsk: `top_logprobs` and
    `logprob_token_ids` asked for without `include` are a 400 naming the field."""
    for name, asked in (("top_logprobs", count), ("logprob_token_ids", token_ids)):
        if asked and not wanted:
            raise InvalidRequestError(
                f"`{name}` needs `include: [{OUTPUT_TEXT_LOGPROBS!r}]`", param=name
            )
    return LogprobAsk(wanted=wanted, count=count, count_param="top_logprobs", token_ids=token_ids)


@dataclass(frozen=True, slots=True)
class LogprobLimits:
    """What the served core and the server allow: the core's K (0: no logprob outputs), whether
    it takes selected IDs and scores prompts, `--max-logprobs` and the vocabulary size."""

    top_k: int
    selects_ids: bool
    scores_prompts: bool
    max_logprobs: int
    vocab_size: int


def check_logprob_ask(ask: LogprobAsk, limits: LogprobLimits) -> None:
    """Raises InvalidRequestError (a 400 before admission) for the first rule `ask` breaks.

    The rules, in order, as api.md lists them (`param` in brackets):
    1. `logprobs` / `top_logprobs` negative or above 20 [the field sent];
    2. chat `top_logprobs` above 0 without `logprobs: true` [`top_logprobs`];
    3. `logprob_token_ids` empty, or without `logprobs` [`logprob_token_ids`];
    4. `prompt_logprobs` negative or above 20, or with `stream: true` [`prompt_logprobs`];
    5. `echo` with `logprobs` and `logprob_token_ids` [`logprob_token_ids`]: prompt positions
       report natural alternatives only;
    6. any logprob request on a core without logprob outputs (K = 0) [`logprobs`];
    7. `logprobs` / `top_logprobs` above `--max-logprobs` or the core's K [the field sent];
    8. `logprob_token_ids` on a natural-only core, more than 128, repeated, or outside the
       vocabulary [`logprob_token_ids`];
    9. prompt logprobs on a server without `--prompt-logprobs`, or `prompt_logprobs` above
       `--max-logprobs` [`prompt_logprobs`].
    """
    _check_shape(ask)
    if ask.wanted:
        _check_generation(ask, limits)
    if ask.prompt_top_k is not None:
        _check_scoring(ask, limits)


def _check_shape(ask: LogprobAsk) -> None:
    """Rules 1-5: what the request alone decides."""
    if ask.count is not None:
        check_logprob_count("sample", ask.count, NATURAL_TOP_K, ask.count_param)
    if ask.count and not ask.wanted:
        raise InvalidRequestError(
            "when using `top_logprobs`, `logprobs` must be set to true.", param="top_logprobs"
        )
    if ask.token_ids is not None and not ask.token_ids:
        raise InvalidRequestError(
            "`logprob_token_ids` must not be empty.", param="logprob_token_ids"
        )
    if ask.token_ids and not ask.wanted:
        raise InvalidRequestError(
            "when using `logprob_token_ids`, `logprobs` must be set.", param="logprob_token_ids"
        )
    if ask.prompt_logprobs is not None:
        check_logprob_count("prompt", ask.prompt_logprobs, NATURAL_TOP_K, "prompt_logprobs")
        if ask.stream:
            raise InvalidRequestError(
                "`prompt_logprobs` are not available when `stream=True`.",
                param="prompt_logprobs",
            )
    if ask.echoes and ask.token_ids:
        raise InvalidRequestError(
            "`logprob_token_ids` cannot be combined with `echo`: prompt positions report "
            "natural alternatives only",
            param="logprob_token_ids",
        )


def _check_generation(ask: LogprobAsk, limits: LogprobLimits) -> None:
    """Rules 6-8: what the served core and `--max-logprobs` allow for generated positions."""
    if limits.top_k == 0:
        raise InvalidRequestError(
            "`logprobs` was requested, but the served model has no logprob outputs "
            "(allow_logprobs is false)",
            param="logprobs",
        )
    limit = min(limits.max_logprobs, limits.top_k)
    check_logprob_count("sample", ask.count or 0, limit, ask.count_param)
    ids = ask.token_ids
    if not ids:
        return
    if not limits.selects_ids:
        raise InvalidRequestError(
            "`logprob_token_ids` needs a core with selected-ID inputs; the served core "
            "reports natural alternatives only",
            param="logprob_token_ids",
        )
    if len(ids) > MAX_SELECTED_IDS:
        raise InvalidRequestError(
            f"Requested logprob_token_ids of length {len(ids)}, which is greater than max "
            f"allowed: {MAX_SELECTED_IDS}",
            param="logprob_token_ids",
        )
    if len(set(ids)) != len(ids):
        raise InvalidRequestError("`logprob_token_ids` must be distinct", param="logprob_token_ids")
    TOKEN_ID.check_each(ids, "logprob_token_ids")
    bad = next((t for t in ids if t >= limits.vocab_size), None)
    if bad is not None:
        raise InvalidRequestError(
            f"logprob token ID {bad} is outside the vocabulary of {limits.vocab_size}",
            param="logprob_token_ids",
        )


def _check_scoring(ask: LogprobAsk, limits: LogprobLimits) -> None:
    """Rule 9: prompt scoring needs a server prepared for it."""
    if not limits.scores_prompts:
        raise InvalidRequestError(
            "prompt logprobs need prompt scoring; start the server with --prompt-logprobs "
            "(or serve a core exported with it)",
            param="prompt_logprobs",
        )
    limit = min(limits.max_logprobs, NATURAL_TOP_K)
    check_logprob_count("prompt", ask.prompt_top_k or 0, limit, "prompt_logprobs")
