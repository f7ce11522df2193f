"""A request's compiled grammar stays ready from admission to its end: the executor never
compiles it again, however many other grammars pass through the compiler's cache meanwhile."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from adapters.grammar.llguidance_compiler import LlguidanceCompiler, LlguidanceGrammar
from adapters.tokenizer.hf import HfTokenizer
from domain.emission.channel import OutputChannel
from domain.emission.outputs import ChoiceDelta, RequestEnd
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams
from domain.structured.grammar import GrammarKind, GrammarSpec
from tests.support.draining import step_until_idle
from tests.support.engines import build_engine

# Compiles after admission take longer than the compiler's time bound, as a loaded host's may.
SLOW_S = 0.6
TIMEOUT_S = 0.3


class SlowAfterAdmission:
    """The compiler's build (its `build=` seam): counts builds; once `slow` is set, each
    build first sleeps SLOW_S."""

    def __init__(self) -> None:
        self.builds = 0
        self.slow = False
        self.compiler: LlguidanceCompiler | None = None

    def __call__(self, spec: GrammarSpec) -> LlguidanceGrammar:
        assert self.compiler is not None
        self.builds += 1
        if self.slow:
            time.sleep(SLOW_S)
        return self.compiler._build(spec)  # noqa: SLF001 - the real llguidance compile


@pytest.mark.model
def test_grammars_evicted_from_the_cache_after_admission_are_not_compiled_again(
    tiny_model_dir: Path,
):
    # A one-entry cache: each admission evicts the grammar admitted before it.
    spy = SlowAfterAdmission()
    compiler = LlguidanceCompiler(
        HfTokenizer.from_dir(tiny_model_dir), cache_size=1, timeout_s=TIMEOUT_S, build=spy
    )
    spy.compiler = compiler
    engine, tokenizer, _ = build_engine(tiny_model_dir, grammars=compiler)
    prompt = tuple(tokenizer.encode("the quick brown fox", add_special_tokens=False))
    params = SamplingParams(temperature=0.0, max_tokens=8)
    patterns = ("[a-c]{3}", "[d-f]{4}", "(x|y)[0-9]{2}")
    requests = [
        EngineRequest(f"r{index}", prompt, params, grammar=GrammarSpec(GrammarKind.REGEX, p))
        for index, p in enumerate(patterns)
    ]
    channels = [OutputChannel(64) for _ in requests]
    checked = [engine.check(request) for request in requests]
    spy.slow = True

    engine.submit_all(list(zip(checked, channels, strict=True)))
    step_until_idle(engine)

    assert spy.builds == len(patterns)
    for channel in channels:
        items = list(iter(channel.get_nowait, None))
        assert isinstance(items[-1], RequestEnd) and items[-1].error is None, items[-1]
        assert sum(len(i.token_ids) for i in items if isinstance(i, ChoiceDelta)) > 0
