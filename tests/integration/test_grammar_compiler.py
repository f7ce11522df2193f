"""The llguidance compiler's admission refusals, per-request compile budget, bounded concurrent
compiles and remembered refusals, over the tiny byte-level tokenizer."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from adapters.grammar.llguidance_compiler import LlguidanceCompiler, LlguidanceGrammar
from adapters.tokenizer.hf import HfTokenizer
from domain.common.errors import InvalidRequestError
from domain.structured.grammar import GrammarKind, GrammarSpec
from tests.support.tokenizers import build_byte_level_bpe

# Forced literals of 180,000 characters: llguidance walks them for seconds before the first
# mask on the tiny vocabulary (about 3 s each on a quiet 2-core box).
SLOW_REGEXES = ("(ab){300}{300}", "(ac){300}{300}", "(bc){300}{300}")
TRIVIAL = GrammarSpec(GrammarKind.REGEX, "(yes|no)")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> HfTokenizer:
    directory: Path = tmp_path_factory.mktemp("grammar-tokenizer")
    build_byte_level_bpe(directory, vocab_size=320)
    return HfTokenizer.from_dir(directory)


@pytest.fixture
def make_compiler(tokenizer: HfTokenizer) -> Iterator:
    made: list[LlguidanceCompiler] = []

    def make(**options: object) -> LlguidanceCompiler:
        made.append(LlguidanceCompiler(tokenizer, **options))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for compiler in made:
        compiler.close()


def refusal(compiler: LlguidanceCompiler, spec: GrammarSpec) -> tuple[InvalidRequestError, float]:
    started = time.monotonic()
    with pytest.raises(InvalidRequestError) as raised:
        compiler.compile(spec)
    return raised.value, time.monotonic() - started


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (GrammarSpec(GrammarKind.REGEX, "\\"), "lone backslash"),
        (GrammarSpec(GrammarKind.REGEX, "ab\\\\\\"), "lone backslash"),
        (
            GrammarSpec(
                GrammarKind.JSON_SCHEMA,
                json.dumps({"type": "string", "pattern": "^a\\"}),
                param="response_format",
            ),
            "lone backslash",
        ),
        (
            GrammarSpec(
                GrammarKind.JSON_SCHEMA,
                json.dumps(
                    {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}
                ),
                param="response_format",
            ),
            "Too many items",
        ),
        (
            GrammarSpec(
                GrammarKind.GRAMMAR, "start: " + " | ".join(f'"w{i}"' for i in range(3000))
            ),
            "3001 items",
        ),
    ],
)
def test_a_constraint_that_breaks_at_its_first_token_is_refused_naming_its_field(
    make_compiler, spec, words
):
    error, _ = refusal(make_compiler(), spec)

    assert words in error.message and error.param == spec.param, error.message


def test_escaped_backslashes_and_a_fine_schema_still_compile(make_compiler):
    compiler = make_compiler()

    compiler.compile(GrammarSpec(GrammarKind.REGEX, "a\\\\"))
    compiler.compile(GrammarSpec(GrammarKind.REGEX, "a\\.b"))
    compiler.compile(
        GrammarSpec(
            GrammarKind.JSON_SCHEMA,
            json.dumps({"type": "object", "properties": {"a": {"$ref": "#"}}}),
        )
    )


def test_a_repeat_of_a_spec_that_timed_out_is_refused_at_once(make_compiler):
    # A build held for 1.5 s, then compiled for real: how slow a real spec compiles depends on
    # the machine and its load, which this rule must not.
    release = threading.Event()
    threading.Timer(1.5, release.set).start()
    build = held_build(make_compiler(timeout_s=30), {"(ab){3}": release})
    compiler = make_compiler(timeout_s=0.5, build=build)
    slow = GrammarSpec(GrammarKind.REGEX, "(ab){3}")

    first, first_wait = refusal(compiler, slow)
    repeat, repeat_wait = refusal(compiler, slow)

    assert "did not compile within 0.5 s" in first.message and first_wait >= 0.45
    assert repeat.message == first.message and repeat.param == first.param
    assert repeat_wait < 0.1, f"the repeat waited {repeat_wait:.2f} s"


@pytest.mark.slow
def test_three_slow_specs_at_once_leave_a_trivial_spec_compiling(make_compiler):
    compiler = make_compiler(timeout_s=2.0)
    slow = [GrammarSpec(GrammarKind.REGEX, regex) for regex in SLOW_REGEXES]

    with ThreadPoolExecutor(len(slow)) as callers:
        pending = [callers.submit(compiler.compile, spec) for spec in slow]
        time.sleep(0.3)
        started = time.monotonic()
        compiled = compiler.compile(TRIVIAL)
        waited = time.monotonic() - started
        outcomes = [future.exception() for future in pending]

    assert isinstance(compiled, LlguidanceGrammar) and waited < 1.0, waited
    # The slow ones are refused on their own budgets (or compiled, on a fast machine).
    assert all(o is None or isinstance(o, InvalidRequestError) for o in outcomes), outcomes


def held_build(real: LlguidanceCompiler, gates: dict[str, threading.Event]):
    """A build that holds each spec with a gate until the gate opens, then compiles it for
    real; `entered` lists the specs whose build began."""
    entered: list[str] = []

    def build(spec: GrammarSpec) -> LlguidanceGrammar:
        entered.append(spec.source)
        if spec.source in gates:
            gates[spec.source].wait(10)
        return real.compile(spec)

    build.entered = entered  # type: ignore[attr-defined]
    return build


def test_waiting_for_a_compile_slot_counts_against_the_request_budget_and_is_not_remembered(
    make_compiler,
):
    release = threading.Event()
    build = held_build(make_compiler(timeout_s=30), {"held": release})
    compiler = make_compiler(timeout_s=0.5, max_compiles=1, build=build)

    with ThreadPoolExecutor(1) as caller:
        holding = caller.submit(compiler.compile, GrammarSpec(GrammarKind.REGEX, "held"))
        while not build.entered:
            time.sleep(0.01)
        error, waited = refusal(compiler, TRIVIAL)
        release.set()
        held_outcome = holding.exception()

    assert "did not compile within 0.5 s" in error.message and 0.45 <= waited < 1.5, waited
    assert build.entered == ["held"] and isinstance(held_outcome, InvalidRequestError)
    assert isinstance(compiler.compile(TRIVIAL), LlguidanceGrammar)


def test_a_compile_that_only_started_late_is_cached_not_refused(make_compiler):
    gates = {"held": threading.Event(), "late": threading.Event()}
    build = held_build(make_compiler(timeout_s=30), gates)
    compiler = make_compiler(timeout_s=0.8, max_compiles=1, build=build)
    late = GrammarSpec(GrammarKind.REGEX, "late")

    with ThreadPoolExecutor(2) as callers:
        callers.submit(compiler.compile, GrammarSpec(GrammarKind.REGEX, "held"))
        while not build.entered:
            time.sleep(0.01)
        waiting = callers.submit(compiler.compile, late)
        time.sleep(0.4)
        gates["held"].set()
        # The caller of `late` gives up 0.8 s after its call; its compile began 0.4 s in and
        # ends within its own budget, 0.6 s in.
        time.sleep(0.6)
        gates["late"].set()
        timed_out = waiting.exception()

    assert isinstance(timed_out, InvalidRequestError) and "did not compile" in timed_out.message
    assert isinstance(compiler.compile(late), LlguidanceGrammar)
    assert build.entered.count("late") == 1


def test_a_spec_refused_once_is_refused_again_without_compiling(make_compiler):
    calls: list[str] = []

    def failing(spec: GrammarSpec) -> LlguidanceGrammar:
        calls.append(spec.source)
        raise InvalidRequestError("the regex is invalid: nope", param=spec.param)

    compiler = make_compiler(build=failing)
    spec = GrammarSpec(GrammarKind.REGEX, "x", param="structured_outputs")

    first, _ = refusal(compiler, spec)
    again, waited = refusal(compiler, spec)

    assert calls == ["x"]
    assert (again.message, again.param) == (first.message, first.param) and again is not first
    assert waited < 0.05


def test_concurrent_requests_for_one_spec_share_its_compile(make_compiler):
    release = threading.Event()
    build = held_build(make_compiler(timeout_s=30), {"(yes|no)": release})
    compiler = make_compiler(timeout_s=5, build=build)

    with ThreadPoolExecutor(3) as callers:
        pending = [callers.submit(compiler.compile, TRIVIAL) for _ in range(3)]
        time.sleep(0.2)
        release.set()
        grammars = [future.result() for future in pending]

    assert build.entered == ["(yes|no)"]
    assert grammars[0] is grammars[1] is grammars[2]


def test_a_remembered_refusal_names_the_field_of_the_request_that_repeats_it(make_compiler):
    compiler = make_compiler()
    schema = json.dumps({"if": {}})

    first, _ = refusal(compiler, GrammarSpec(GrammarKind.JSON_SCHEMA, schema, "response_format"))
    again, _ = refusal(compiler, GrammarSpec(GrammarKind.JSON_SCHEMA, schema, "tools"))

    assert (first.param, again.param) == ("response_format", "tools")
    assert again.message == first.message
