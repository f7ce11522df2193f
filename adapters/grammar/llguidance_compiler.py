"""The grammar port over llguidance: compiled specs in a bounded LRU, remembered refusals,
bounded concurrent compiles with a time budget per request, matchers."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING

import llguidance
import numpy
from llguidance.gbnf_to_lark import gbnf_to_lark

from domain.common.errors import InvalidRequestError
from domain.structured.grammar import GrammarKind, GrammarSpec
from ports.tokenizer import Tokenizer

if TYPE_CHECKING:  # a TypedDict of the stub only
    from llguidance._lib import JsonCompileOptions

# A request whose constraint has not compiled this long after its check started is a 400;
# llguidance's own fuel limits bound the work that goes on after the request has been answered.
COMPILE_TIMEOUT_S = 5.0
CACHE_SIZE = 256
# Specs refused for what they are, kept so a repeat costs nothing (the key and one message each).
REFUSED_SIZE = 1024
# Compiles running at once, each holding its slot until it ends (timed out or not): three slow
# specs still leave a slot for a trivial one.
MAX_COMPILES = 4
# How many allowed first tokens are fed to copies of a fresh matcher: limits that break at the
# first token (an endless nesting, thousands of alternatives behind one prefix) show there.
FIRST_TOKEN_PROBES = 16
_BUDGET_SLACK_S = 0.05
# Compile threads yield the CPU to the engine and the event loop on a busy machine.
_COMPILE_NICENESS = 10
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

    Compiles run on at most `max_compiles` low-priority threads; a caller waits for a slot and
    for its compile within `timeout_s` of its own call, and a compile it stops waiting for goes
    on in the background, holding its slot. Compiled grammars are kept by content
    (`GrammarSpec.key`) in an LRU of `cache_size` entries, shared by the engine's admission
    check and the executor; specs refused for what they are (invalid, over a limit at the first
    token, or a compile that on its own ran over `timeout_s`) are kept with their error in an
    LRU of `refused_size` and refused again at once. `build` replaces the llguidance compile
    (tests slow it down). `timeout_s` None bounds nothing: for a spec another compiler already
    admitted (a tensor-parallel peer's). A grammar that left the LRU is still found while
    anything holds it (an admitted request, a constrained lane), so it is never compiled twice
    while in use.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        cache_size: int = CACHE_SIZE,
        timeout_s: float | None = COMPILE_TIMEOUT_S,
        limits: llguidance.LLParserLimits | None = None,
        max_compiles: int = MAX_COMPILES,
        refused_size: int = REFUSED_SIZE,
        build: Callable[[GrammarSpec], LlguidanceGrammar] | None = None,
    ) -> None:
        if max_compiles < 1:
            raise ValueError(f"max_compiles must be at least 1, got {max_compiles}")
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
        self._refused: OrderedDict[tuple[str, str], InvalidRequestError] = OrderedDict()
        self._refused_size = refused_size
        self._compiling: dict[tuple[str, str], Future[LlguidanceGrammar]] = {}
        self._began: dict[tuple[str, str], float] = {}
        self._timeout_s = timeout_s
        self._limits = limits
        self._build_grammar = build if build is not None else self._build
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_compiles)
        self._pool = ThreadPoolExecutor(
            max_workers=max_compiles,
            thread_name_prefix="grammar-compile",
            initializer=_lower_priority,
        )

    def compile(self, spec: GrammarSpec) -> LlguidanceGrammar:
        """The compiled grammar, from the cache, a compile under way, or a new compile; blocks
        at most `timeout_s` (a slot's wait included) and raises InvalidRequestError."""
        deadline = time.monotonic() + (self._timeout_s if self._timeout_s is not None else 1e9)
        with self._lock:
            compiling = self._known(spec)
        if isinstance(compiling, LlguidanceGrammar):
            return compiling
        if compiling is None:
            compiling = self._start(spec, deadline)
        try:
            return compiling.result(timeout=max(0.0, deadline - time.monotonic()))
        except InvalidRequestError as error:
            raise _copy(error, spec) from None
        except FutureTimeout:
            raise self._timed_out(spec) from None

    def _timed_out(self, spec: GrammarSpec) -> InvalidRequestError:
        """The 400 for a caller that stopped waiting; a compile that has itself run over the
        budget is remembered as refused now, while it goes on in the background."""
        with self._lock:
            refused = self._refused.get(spec.key)
            if refused is not None:
                return _copy(refused, spec)
            refusal = self._over_budget(spec)
            began = self._began.get(spec.key)
            if began is not None and self._overran(time.monotonic() - began):
                _remember(self._refused, spec.key, refusal, self._refused_size)
            return _copy(refusal, spec)

    def _known(self, spec: GrammarSpec) -> LlguidanceGrammar | Future[LlguidanceGrammar] | None:
        """Under the lock: the cached grammar or the compile under way; raises a remembered
        refusal."""
        cached = self._cache.get(spec.key) or self._held.get(spec.key)
        if cached is not None:
            _remember(self._cache, spec.key, cached, self._cache_size)
            return cached
        refused = self._refused.get(spec.key)
        if refused is not None:
            self._refused.move_to_end(spec.key)
            raise _copy(refused, spec)
        return self._compiling.get(spec.key)

    def _start(self, spec: GrammarSpec, deadline: float) -> Future[LlguidanceGrammar]:
        """Takes a compile slot (waiting until `deadline`) and starts the compile, or joins one
        that another caller started meanwhile."""
        if not self._slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
            # The spec is not at fault: nothing is remembered.
            raise self._over_budget(spec)
        with self._lock:
            try:
                known = self._known(spec)
            except InvalidRequestError:
                self._slots.release()
                raise
            if known is not None:
                self._slots.release()
                if isinstance(known, LlguidanceGrammar):
                    done: Future[LlguidanceGrammar] = Future()
                    done.set_result(known)
                    return done
                return known
            # A slot is a pool thread: the compile starts now.
            self._began[spec.key] = time.monotonic()
            started = self._pool.submit(self._run, spec)
            self._compiling[spec.key] = started
            return started

    def _run(self, spec: GrammarSpec) -> LlguidanceGrammar:
        """One compile on a pool thread: its outcome is cached or remembered, then its slot
        freed."""
        began = time.monotonic()
        try:
            compiled = self._build_grammar(spec)
        except InvalidRequestError as error:
            self._finish(spec, refused=error)
            raise
        except Exception as error:  # noqa: BLE001 - a compiler crash is the spec's refusal too
            refusal = InvalidRequestError(
                f"{_WHAT[spec.kind]} could not be compiled: {error}", param=spec.param
            )
            self._finish(spec, refused=refusal)
            raise refusal from None
        if self._overran(time.monotonic() - began):
            refusal = self._over_budget(spec)
            self._finish(spec, refused=refusal)
            raise refusal
        self._finish(spec, compiled=compiled)
        return compiled

    def _finish(
        self,
        spec: GrammarSpec,
        *,
        compiled: LlguidanceGrammar | None = None,
        refused: InvalidRequestError | None = None,
    ) -> None:
        with self._lock:
            # A refusal remembered when a caller timed out stands.
            if compiled is not None and spec.key not in self._refused:
                _remember(self._cache, spec.key, compiled, self._cache_size)
                self._held[spec.key] = compiled
            if refused is not None:
                _remember(self._refused, spec.key, refused, self._refused_size)
            self._compiling.pop(spec.key, None)
            self._began.pop(spec.key, None)
        self._slots.release()

    def _overran(self, elapsed: float) -> bool:
        # The slack absorbs the moments between a caller's call and its compile's start.
        return self._timeout_s is not None and elapsed >= self._timeout_s - _BUDGET_SLACK_S

    def _over_budget(self, spec: GrammarSpec) -> InvalidRequestError:
        return InvalidRequestError(
            f"{_WHAT[spec.kind]} did not compile within {self._timeout_s or 0:g} s",
            param=spec.param,
        )

    def _build(self, spec: GrammarSpec) -> LlguidanceGrammar:
        what = _WHAT[spec.kind]
        try:
            grammar = _grammar_text(spec)
        except Exception as error:  # noqa: BLE001 - whatever the source is, it is the caller's
            raise InvalidRequestError(f"{what} is invalid: {error}", param=spec.param) from None
        matcher = llguidance.LLMatcher(self._tokenizer, grammar, log_level=0, limits=self._limits)
        # The first mask builds the lexer's start states, where an unworkable grammar shows;
        # feeding it a spread of the first tokens it allows shows limits broken at once.
        problem = matcher.get_error() if matcher.is_error() else _first_token_error(matcher)
        if problem is not None:
            raise InvalidRequestError(
                f"{what} is not supported: {_first_line(problem)}", param=spec.param
            )
        return LlguidanceGrammar(matcher, self.vocab_size)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _first_token_error(matcher: llguidance.LLMatcher) -> str | None:
    """llguidance's error for the first mask or for one of a spread of the tokens it allows
    (each fed to a copy); None when all of them are fine."""
    mask = matcher.compute_bitmask()
    if matcher.is_error():
        return matcher.get_error()
    allowed = numpy.flatnonzero(
        numpy.unpackbits(numpy.frombuffer(mask, numpy.uint8), bitorder="little")
    )
    step = max(1, len(allowed) // FIRST_TOKEN_PROBES)
    for token_id in allowed[::step][:FIRST_TOKEN_PROBES].tolist():
        probe = matcher.deep_copy()
        if probe.consume_token(token_id) and not probe.is_error():
            probe.compute_bitmask()
        if probe.is_error():
            return probe.get_error()
    return None


def _remember(table: OrderedDict, key: tuple[str, str], value: object, size: int) -> None:
    table[key] = value
    table.move_to_end(key)
    while len(table) > size:
        table.popitem(last=False)


def _copy(error: InvalidRequestError, spec: GrammarSpec) -> InvalidRequestError:
    """A fresh exception with a remembered (or shared) refusal's message, naming the field
    this caller's spec came from (equal specs may come from different fields)."""
    return InvalidRequestError(error.message, param=spec.param)


def _lower_priority() -> None:
    """Lowers the calling thread's CPU priority (Linux sets niceness per thread)."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _COMPILE_NICENESS)


def _grammar_text(spec: GrammarSpec) -> str:
    """llguidance's grammar for a spec; ValueError when the source does not parse."""
    match spec.kind:
        case GrammarKind.JSON_SCHEMA | GrammarKind.JSON_OBJECT:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(
                spec.source, defaults=_JSON_OPTIONS
            )
            for pattern in _schema_patterns(json.loads(spec.source)):
                _check_escapes(pattern, f"the pattern {pattern!r}")
            return grammar
        case GrammarKind.REGEX:
            _check_escapes(spec.source, "it")
            return llguidance.LLMatcher.grammar_from_regex(spec.source)
        case GrammarKind.CHOICE:
            # JSON string escapes are valid Lark literal escapes.
            choices = " | ".join(json.dumps(c) for c in json.loads(spec.source))
            return llguidance.LLMatcher.grammar_from_lark(f"start: {choices}")
        case GrammarKind.GRAMMAR:
            lark = gbnf_to_lark(spec.source) if "::=" in spec.source else spec.source
            return llguidance.LLMatcher.grammar_from_lark(lark)
    raise ValueError(f"unknown grammar kind {spec.kind}")


def _check_escapes(regex: str, what: str) -> None:
    """Refuses a regex whose last backslash escapes nothing: llguidance drops it and would
    quietly constrain to something else."""
    trailing = len(regex) - len(regex.rstrip("\\"))
    if trailing % 2:
        raise ValueError(f"{what} ends with a lone backslash, which escapes nothing")


def _schema_patterns(schema: object) -> list[str]:
    """Every `pattern` and `patternProperties` regex in a JSON schema."""
    found: list[str] = []
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "pattern" and isinstance(value, str):
                found.append(value)
            elif key == "patternProperties" and isinstance(value, dict):
                found.extend(value)
            found.extend(_schema_patterns(value))
    elif isinstance(schema, list):
        for item in schema:
            found.extend(_schema_patterns(item))
    return found


def _first_line(message: str) -> str:
    """llguidance's error, without the source excerpt it appends after the first lines."""
    lines = [line for line in message.strip().splitlines() if line.strip()]
    return " ".join(lines[:4]) if lines else "unknown error"
