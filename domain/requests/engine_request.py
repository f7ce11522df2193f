"""One prompt as the engine runs it: token IDs, sampling settings, choices, logprob wishes."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from domain.cache.salt import check_cache_salt
from domain.common.errors import InvalidRequestError
from domain.common.ranges import CHOICES, check_token_ids
from domain.logprobs.rules import NO_LOGPROBS_ASKED, LogprobAsk, LogprobLimits, check_logprob_ask
from domain.logprobs.values import LogprobOptions
from domain.reasoning.thinking import ThinkingBudget
from domain.requests.sampling import SamplingParams
from domain.structured.grammar import GrammarSpec

if TYPE_CHECKING:  # the domain names the port's type only
    from ports.grammar import CompiledGrammar, GrammarCompiler

_SEED_MIX = 0x9E3779B97F4A7C15
_SEED_MASK = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """What the engine generates for one prompt; `n` choices share it and differ by seed.

    `logprobs` is the request's logprob ask (`domain.logprobs.rules`); with `prefill_only` the
    prompt is scored and nothing is generated (echo with `max_tokens` 0). With a `grammar`
    every choice's output is constrained to it, from its first token or, when `thinking` reads
    the output as beginning inside reasoning, from the token after that block's end. With a
    `thinking` budget each choice's reasoning blocks are closed at it by forced end tokens.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    n: int = 1
    logprobs: LogprobAsk = NO_LOGPROBS_ASKED
    prefill_only: bool = False
    grammar: GrammarSpec | None = None
    thinking: ThinkingBudget | None = None
    # Scopes the prefix cache: a request reads only blocks published under the same salt.
    cache_salt: str | None = None

    def __post_init__(self) -> None:
        if self.prefill_only and not self.score_prompt:
            raise ValueError("a prefill-only request must score its prompt")
        if not self.prompt_token_ids:
            raise InvalidRequestError("the prompt must contain at least one token", param="prompt")
        if isinstance(self.n, bool) or not isinstance(self.n, int):
            raise InvalidRequestError("`n` must be an integer.", param="n")
        CHOICES.check(self.n, "n")
        check_cache_salt(self.cache_salt)

    @property
    def options(self) -> LogprobOptions | None:
        """What each generated position reports, or None without logprobs."""
        return self.logprobs.options

    @property
    def prompt_top_k(self) -> int | None:
        """Alternatives per scored prompt position; None when the prompt is not scored."""
        return self.logprobs.prompt_top_k

    @property
    def score_prompt(self) -> bool:
        return self.prompt_top_k is not None

    def check_limits(self, vocab_size: int, max_model_len: int) -> None:
        """Rejects prompts the model cannot take, before admission."""
        prompt_len = len(self.prompt_token_ids)
        check_token_ids(self.prompt_token_ids, vocab_size, "prompt")
        self.params.check_token_ids(vocab_size)
        if prompt_len >= max_model_len:
            raise InvalidRequestError(
                f"This model's maximum context length is {max_model_len} tokens; the prompt has "
                f"{prompt_len} tokens, which leaves no room to generate",
                param="prompt",
            )
        if prompt_len + self.params.min_tokens > max_model_len:
            raise InvalidRequestError(
                f"min_tokens {self.params.min_tokens} does not fit: the prompt has {prompt_len} of "
                f"the model's {max_model_len} positions",
                param="min_tokens",
            )
        max_tokens = self.params.max_tokens
        if max_tokens is not None and prompt_len + max_tokens > max_model_len:
            raise InvalidRequestError(
                f"This model's maximum context length is {max_model_len} tokens. However, you "
                f"requested {prompt_len + max_tokens} tokens ({prompt_len} in the prompt, "
                f"{max_tokens} in the completion)",
                param="max_tokens",
            )

    def choice_seed(self, index: int, fallback: int) -> int:
        """Seed of choice `index`: the request's seed for choice 0, mixed for the others."""
        base = fallback if self.params.seed is None else self.params.seed & _SEED_MASK
        return base if index == 0 else (base ^ (index * _SEED_MIX)) & _SEED_MASK


@dataclass(frozen=True, slots=True)
class CheckedRequest:
    """A request its engine's `check` accepted; engines queue only these, so nothing is checked
    twice and nothing unchecked is admitted. `issuer` is the engine that checked it.

    `grammar` is the compiled output constraint the check made (None without one); the engine
    holds it for the request's lifetime, so that the compiler's cache cannot lose it between
    admission and the steps that need it.
    """

    request: EngineRequest
    issuer: object = field(compare=False, repr=False)
    grammar: CompiledGrammar | None = field(default=None, compare=False, repr=False)

    @classmethod
    def check(
        cls,
        request: EngineRequest,
        issuer: object,
        limits: LogprobLimits,
        max_model_len: int,
        grammars: GrammarCompiler | None,
    ) -> CheckedRequest:
        """Raises InvalidRequestError for a request beyond the issuer's limits, or with an
        output constraint its grammar engine (if any) cannot compile; the compile blocks for
        up to that engine's budget."""
        request.check_limits(limits.vocab_size, max_model_len)
        check_logprob_ask(request.logprobs, limits)
        if request.grammar is None:
            return cls(request, issuer)
        if grammars is None:
            raise InvalidRequestError(
                "structured outputs need a grammar engine, and this server has none",
                param=request.grammar.param,
            )
        return cls(request, issuer, grammars.compile(request.grammar))


def fresh_seed() -> int:
    """A seed for an unseeded request: 63 bits from a generator this process seeded once from
    the OS.

    A `SystemRandom()` a request read 2,500 bytes of entropy to seed a generator it never used
    (3% of the engine thread); `os.urandom` a request then gave up the GIL for its system call,
    and the engine thread waited for a busy thread's switch interval to get it back (4.8% of
    its samples at 64 streams, docs/performance.md).
    """
    return _SEEDS.draw()


class _SeedSource:
    """One `random.Random` per process, seeded from the OS on first use and again in a forked
    child, so that two processes never draw the same seeds."""

    def __init__(self) -> None:
        self._generator: random.Random | None = None
        self._watching_forks = False

    def draw(self) -> int:
        generator = self._generator
        if generator is None:
            generator = self._generator = random.Random(os.urandom(32))
            if not self._watching_forks:
                self._watching_forks = True
                os.register_at_fork(after_in_child=self._forget)
        return generator.getrandbits(63)

    def _forget(self) -> None:
        self._generator = None


_SEEDS = _SeedSource()
