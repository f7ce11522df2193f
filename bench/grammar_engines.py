"""Grammar engines side by side: llguidance and xgrammar, compile time and mask time per token.

Run: `.venv/bin/python bench/grammar_engines.py [--rounds 5]`. Both engines get the SmolLM2
tokenizer's raw token bytes and the same constraints: a JSON schema (nested objects, arrays,
enums, ranges, patterns), any JSON object, a regex, a choice and a GBNF grammar. Compile is cold
(llguidance through Helios's own compiler with a spec it has not seen; xgrammar with its cache
off), one thread each, median of the rounds. Mask time walks a valid output token by token
(its ordinary tokenization, then EOS): fill the next bitmask, then accept the token; the fill
alone is timed. xgrammar is optional: without it the script measures llguidance and says so.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.gpu.loading.default_model import default_gguf_path, exported_model_dir  # noqa: E402
from adapters.grammar.llguidance_compiler import LlguidanceCompiler  # noqa: E402
from adapters.tokenizer.hf import HfTokenizer  # noqa: E402
from domain.structured.grammar import GrammarKind, GrammarSpec  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prompts import PERSON_SCHEMA  # noqa: E402

try:
    import xgrammar
except ImportError:  # optional: the project does not depend on it
    xgrammar = None

PERSON_TEXT = json.dumps(
    {
        "name": "Ada Lovelace",
        "age": 36,
        "email": "ada@analytical.com",
        "address": {"city": "London", "zip": "10115"},
        "hobbies": ["mathematics", "poetry", "horses"],
        "status": "active",
    }
)
ANY_JSON_TEXT = json.dumps(
    {"id": 7, "tags": ["a", "bc"], "ratio": -0.25, "ok": True, "nested": {"x": None, "y": [1, 2]}}
)
REGEX = r"[A-Z][a-z]+( [a-z]+){3,12}\."
REGEX_TEXT = "The quick brown fox jumps over the lazy dog."
CHOICES = ["positive", "negative", "neutral"]
GBNF = (
    "root ::= expr\n"
    'expr ::= term ((" + " | " - ") term)*\n'
    'term ::= factor ((" * " | " / ") factor)*\n'
    'factor ::= [0-9]+ | "(" expr ")"\n'
)
GBNF_TEXT = "(12 + 7) * 3 - 45 / (6 + 2 * 9)"


@dataclass(frozen=True)
class Case:
    """One constraint: its kind, source (varied per round so no cache answers) and a valid text."""

    kind: GrammarKind
    text: str

    def source(self, round_index: int) -> str:
        match self.kind:
            case GrammarKind.JSON_SCHEMA:
                return json.dumps({**PERSON_SCHEMA, "title": f"person {round_index}"})
            case GrammarKind.JSON_OBJECT:
                return json.dumps({"type": "object", "title": f"any {round_index}"})
            case GrammarKind.REGEX:
                # An alternative no output takes, so each round's regex is a new one.
                return f"({REGEX})|(x{round_index})"
            case GrammarKind.CHOICE:
                return json.dumps([*CHOICES, f"other {round_index}"])
            case GrammarKind.GRAMMAR:
                return GBNF + f'unused ::= "u{round_index}"\n'
        raise ValueError(self.kind)


CASES = (
    Case(GrammarKind.JSON_SCHEMA, PERSON_TEXT),
    Case(GrammarKind.JSON_OBJECT, ANY_JSON_TEXT),
    Case(GrammarKind.REGEX, REGEX_TEXT),
    Case(GrammarKind.CHOICE, "negative"),
    Case(GrammarKind.GRAMMAR, GBNF_TEXT),
)


@dataclass(frozen=True)
class Result:
    """One engine on one case, medians over rounds: compile in ms, masks in us, and the whole
    request's grammar time (compile and every mask) in ms."""

    compile_ms: float
    first_mask_us: float
    mask_us: float
    slowest_mask_us: float
    request_ms: float
    tokens: int


class Llguidance:
    """llguidance as Helios uses it: LlguidanceCompiler (a cold spec each time) and its matcher."""

    name = "llguidance"

    def __init__(self, tokenizer: HfTokenizer) -> None:
        self._compiler = LlguidanceCompiler(tokenizer, cache_size=1)

    def compile(self, case: Case, round_index: int):
        spec = GrammarSpec(case.kind, case.source(round_index))
        return self._compiler.compile(spec)

    def walk(self, compiled, tokens: list[int], bitmask: torch.Tensor) -> list[float]:
        matcher = compiled.matcher()
        times = []
        for token in tokens:
            began = time.perf_counter()
            matcher.fill_bitmask(bitmask.data_ptr())
            times.append(time.perf_counter() - began)
            if not _allows(bitmask, token) or not matcher.accept((token,)):
                raise RuntimeError(f"llguidance refused token {token}")
        return times


class Xgrammar:
    """xgrammar over the same raw token bytes, one compile thread, its cache off."""

    name = "xgrammar"

    def __init__(self, tokenizer: HfTokenizer) -> None:
        assert xgrammar is not None
        info = xgrammar.TokenizerInfo(
            [tokenizer.token_bytes(t) for t in range(tokenizer.vocab_size)],
            xgrammar.VocabType.RAW,
            vocab_size=tokenizer.vocab_size,
            stop_token_ids=sorted(tokenizer.eos_token_ids),
        )
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def compile(self, case: Case, round_index: int):
        source = case.source(round_index)
        match case.kind:
            case GrammarKind.JSON_SCHEMA | GrammarKind.JSON_OBJECT:
                # Helios writes JSON as json.dumps does, with no free whitespace.
                return self._compiler.compile_json_schema(
                    source, any_whitespace=False, separators=(", ", ": ")
                )
            case GrammarKind.REGEX:
                return self._compiler.compile_regex(source)
            case GrammarKind.CHOICE:
                rule = " | ".join(json.dumps(choice) for choice in json.loads(source))
                return self._compiler.compile_grammar(f"root ::= {rule}\n")
            case GrammarKind.GRAMMAR:
                return self._compiler.compile_grammar(source)
        raise ValueError(case.kind)

    def walk(self, compiled, tokens: list[int], bitmask: torch.Tensor) -> list[float]:
        assert xgrammar is not None
        matcher = xgrammar.GrammarMatcher(compiled)
        row = bitmask.view(1, -1)
        times = []
        for token in tokens:
            began = time.perf_counter()
            matcher.fill_next_token_bitmask(row, 0)
            times.append(time.perf_counter() - began)
            if not _allows(bitmask, token) or not matcher.accept_token(token):
                raise RuntimeError(f"xgrammar refused token {token}")
        return times


def _allows(bitmask: torch.Tensor, token: int) -> bool:
    return bool(int(bitmask[token >> 5]) >> (token & 31) & 1)


def measure(engine, case: Case, tokens: list[int], vocab_size: int, rounds: int) -> Result:
    bitmask = torch.zeros((vocab_size + 31) // 32, dtype=torch.int32)
    compiles, firsts, means, slowest, requests = [], [], [], [], []
    for round_index in range(rounds):
        began = time.perf_counter()
        compiled = engine.compile(case, round_index)
        compiles.append(time.perf_counter() - began)
        # Masks of the first walk after a cold compile, so work an engine defers is counted.
        times = engine.walk(compiled, tokens, bitmask)
        firsts.append(times[0])
        means.append(statistics.fmean(times))
        slowest.append(max(times))
        requests.append(compiles[-1] + sum(times))
    return Result(
        statistics.median(compiles) * 1e3,
        statistics.median(firsts) * 1e6,
        statistics.median(means) * 1e6,
        statistics.median(slowest) * 1e6,
        statistics.median(requests) * 1e3,
        len(tokens),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)

    tokenizer = HfTokenizer.from_dir(exported_model_dir(default_gguf_path(), progress=False))
    eos = min(tokenizer.eos_token_ids)
    walks = {
        case.kind: [*tokenizer.encode(case.text, add_special_tokens=False), eos] for case in CASES
    }
    kinds = {Llguidance: "llguidance", Xgrammar: "xgrammar"}
    engines, setups = [], {}
    for kind, name in kinds.items():
        if kind is Xgrammar and xgrammar is None:
            continue
        began = time.perf_counter()
        engines.append(kind(tokenizer))
        setups[name] = (time.perf_counter() - began) * 1e3

    versions = {"llguidance": _version("llguidance"), "xgrammar": _version("xgrammar")}
    print(
        f"# grammar engines over the SmolLM2 tokenizer ({tokenizer.vocab_size} tokens); "
        f"median of {args.rounds}; "
        + ", ".join(f"{name} {versions[name] or 'not installed'}" for name in kinds.values())
    )
    print(
        "| engine | constraint | tokens | cold compile ms | first mask us | mask us/token "
        "| slowest mask us | compile + masks ms |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for engine in engines:
        for case in CASES:
            found = measure(engine, case, walks[case.kind], tokenizer.vocab_size, args.rounds)
            print(
                f"| {engine.name} | {case.kind.value} | {found.tokens} | {found.compile_ms:.2f} | "
                f"{found.first_mask_us:.0f} | {found.mask_us:.1f} | {found.slowest_mask_us:.0f} | "
                f"{found.request_ms:.2f} |"
            )
    print(
        "tokenizer setup (once per process): "
        + ", ".join(f"{name} {ms:.0f} ms" for name, ms in setups.items())
    )
    if xgrammar is None:
        print("xgrammar: not installed, so only llguidance was measured (pip install xgrammar)")


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()
