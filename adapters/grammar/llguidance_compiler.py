"""The grammar port over llguidance: compiled specs in a bounded LRU, matchers, time bounds."""

from __future__ import annotations

import json
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING

import llguidance
from llguidance.gbnf_to_lark import gbnf_to_lark

from domain.errors import InvalidRequestError
from domain.grammar import GrammarKind, GrammarSpec
from ports.tokenizer import Tokenizer

if TYPE_CHECKING:  # a TypedDict of the stub only
    from llguidance._lib import JsonCompileOptions

# A compile that takes longer than this is a 400; llguidance's own fuel limits bound the work
# that goes on after the request has been answered.
COMPILE_TIMEOUT_S = 5.0
CACHE_SIZE = 256
# JSON as models write it (`json.dumps` style), with no freedom to pad with whitespace forever.
_JSON_OPTIONS: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
_WHAT = {
    GrammarKind.JSON_SCHEMA: "the JSON schema",
    GrammarKind.JSON_OBJECT: "the JSON object constraint",
    GrammarKind.REGEX: "the regex",
    GrammarKind.CHOICE: "the choices",
    GrammarKind.GRAMMAR: "the grammar",
}


class _Vocabulary:
    """The tokenizer as llguidance's TokenizerWrapper reads it: raw token bytes and encode."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokens = [tokenizer.token_bytes(t) for t in range(tokenizer.vocab_size)]
        self.eos_token_id = min(tokenizer.eos_token_ids)
        self.bos_token_id = tokenizer.bos_token_id
        self.special_token_ids = sorted(tokenizer.special_token_ids)
        self._tokenizer = tokenizer

    def __call__(self, text: bytes | str) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tokenizer.encode(text, add_special_tokens=False)


class LlguidanceMatcher:
    """Implements ports.grammar.GrammarMatcher; `fill_bitmask` writes the next mask in place."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int) -> None:
        self._matcher = matcher
        self._vocab_size = vocab_size
        self.mask_bytes = 4 * ((vocab_size + 31) // 32)

    @property
    def is_finished(self) -> bool:
        return self._matcher.is_accepting()

    def allowed_token_ids(self) -> frozenset[int]:
        mask = self._matcher.compute_bitmask()
        return frozenset(t for t in range(self._vocab_size) if mask[t >> 3] >> (t & 7) & 1)

    def accept(self, token_ids: Sequence[int]) -> bool:
        # One at a time: consume_tokens refuses EOS once the output is complete (stopped),
        # where consume_token takes it.
        return all(self._matcher.consume_token(token_id) for token_id in token_ids)

    def rollback(self, count: int) -> None:
        if count and not self._matcher.rollback(count):
            raise RuntimeError(f"the grammar matcher cannot roll back {count} tokens")

    def fill_bitmask(self, address: int) -> None:
        """Writes the allowed-token bits (bit t % 32 of int32 word t // 32) at `address`, which
        holds `mask_bytes`; llguidance releases the GIL while it computes."""
        self._matcher.unsafe_compute_mask_ptr(address, self.mask_bytes)

    @property
    def error(self) -> str:
        return self._matcher.get_error()


class LlguidanceGrammar:
    """Implements ports.grammar.CompiledGrammar: a started matcher that new ones copy."""

    def __init__(self, template: llguidance.LLMatcher, vocab_size: int) -> None:
        self._template = template
        self._vocab_size = vocab_size

    def matcher(self) -> LlguidanceMatcher:
        return LlguidanceMatcher(self._template.deep_copy(), self._vocab_size)


class LlguidanceCompiler:
    """Implements ports.grammar.GrammarCompiler for one tokenizer.

    Compiles run on a small thread pool so a pathological spec costs its caller at most
    `timeout_s` (None: no bound, for a spec some other compiler already admitted); compiled
    grammars are kept by content (`GrammarSpec.key`) in an LRU of `cache_size` entries, shared
    by the engine's admission check and the executor. A grammar that left the LRU is still
    found while anything holds it (an admitted request, a constrained lane), so it is never
    compiled twice while in use.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        cache_size: int = CACHE_SIZE,
        timeout_s: float | None = COMPILE_TIMEOUT_S,
        limits: llguidance.LLParserLimits | None = None,
    ) -> None:
        self.vocab_size = tokenizer.vocab_size
        self.eos_token_ids = tokenizer.eos_token_ids
        self._tokenizer = llguidance.LLTokenizer(
            llguidance.TokenizerWrapper(_Vocabulary(tokenizer)),
            eos_token=sorted(tokenizer.eos_token_ids),
        )
        self._cache: OrderedDict[tuple[str, str], LlguidanceGrammar] = OrderedDict()
        self._held: weakref.WeakValueDictionary[tuple[str, str], LlguidanceGrammar] = (
            weakref.WeakValueDictionary()
        )
        self._cache_size = cache_size
        self._timeout_s = timeout_s
        self._limits = limits
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="grammar-compile")

    def compile(self, spec: GrammarSpec) -> LlguidanceGrammar:
        with self._lock:
            cached = self._cache.get(spec.key) or self._held.get(spec.key)
            if cached is not None:
                self._cache[spec.key] = cached
                self._cache.move_to_end(spec.key)
                self._trim()
                return cached
        try:
            compiled = self._pool.submit(self._build, spec).result(timeout=self._timeout_s)
        except FutureTimeout:
            raise InvalidRequestError(
                f"{_WHAT[spec.kind]} did not compile within {self._timeout_s:g} s",
                param=spec.param,
            ) from None
        with self._lock:
            self._cache[spec.key] = compiled
            self._cache.move_to_end(spec.key)
            self._held[spec.key] = compiled
            self._trim()
        return compiled

    def _trim(self) -> None:
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    def _build(self, spec: GrammarSpec) -> LlguidanceGrammar:
        what = _WHAT[spec.kind]
        try:
            grammar = _grammar_text(spec)
        except Exception as error:  # noqa: BLE001 - whatever the source is, it is the caller's
            raise InvalidRequestError(f"{what} is invalid: {error}", param=spec.param) from None
        matcher = llguidance.LLMatcher(self._tokenizer, grammar, log_level=0, limits=self._limits)
        # The first mask builds the lexer's start states, where an unworkable grammar shows.
        if not matcher.is_error():
            matcher.compute_bitmask()
        if matcher.is_error():
            raise InvalidRequestError(
                f"{what} is not supported: {_first_line(matcher.get_error())}", param=spec.param
            )
        return LlguidanceGrammar(matcher, self.vocab_size)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _grammar_text(spec: GrammarSpec) -> str:
    """llguidance's grammar for a spec; ValueError when the source does not parse."""
    match spec.kind:
        case GrammarKind.JSON_SCHEMA | GrammarKind.JSON_OBJECT:
            return llguidance.LLMatcher.grammar_from_json_schema(
                spec.source, defaults=_JSON_OPTIONS
            )
        case GrammarKind.REGEX:
            return llguidance.LLMatcher.grammar_from_regex(spec.source)
        case GrammarKind.CHOICE:
            # JSON string escapes are valid Lark literal escapes.
            choices = " | ".join(json.dumps(c) for c in json.loads(spec.source))
            return llguidance.LLMatcher.grammar_from_lark(f"start: {choices}")
        case GrammarKind.GRAMMAR:
            lark = gbnf_to_lark(spec.source) if "::=" in spec.source else spec.source
            return llguidance.LLMatcher.grammar_from_lark(lark)
    raise ValueError(f"unknown grammar kind {spec.kind}")


def _first_line(message: str) -> str:
    """llguidance's error, without the source excerpt it appends after the first lines."""
    lines = [line for line in message.strip().splitlines() if line.strip()]
    return " ".join(lines[:4]) if lines else "unknown error"
