"""The engine with output constraints over the fake executor and the fake choice grammar."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from domain.common.errors import InvalidRequestError
from domain.contract.capabilities import NO_LOGPROBS
from domain.contract.frames import FrameResult
from domain.contract.records import Role
from domain.emission.outputs import ChoiceDelta
from domain.engine.engine import Engine, EngineConfig
from domain.logprobs.rules import LogprobAsk
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams
from domain.speculation.drafts import SpeculativeConfig, SpeculativeMethod
from domain.structured.grammar import GrammarKind, GrammarSpec
from tests.fakes import (
    FAKE_EOS,
    FakeExecutor,
    FakeGrammarCompiler,
    FakeTokenizer,
    RecordingObserver,
    fake_logprobs,
    next_token,
)
from tests.support.draining import drain
from tests.support.geometry import fake_geometry

CHOICES = ("cab", "dog", "bead", "deed")
PROMPT = (3, 9, 14, 27, 5, 41)


class RecordingExecutor(FakeExecutor):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.results: list[FrameResult] = []

    def read(self, frame: int) -> FrameResult:
        result = super().read(frame)
        self.results.append(result)
        return result


def make_engine(
    *,
    num_blocks: int = 64,
    speculative: SpeculativeConfig | None = None,
    model=next_token,
    observer: RecordingObserver | None = None,
) -> tuple[Engine, RecordingExecutor, FakeGrammarCompiler]:
    geometry = fake_geometry(block_size=2, num_blocks=num_blocks, max_model_len=48)
    compiler = FakeGrammarCompiler()
    executor = RecordingExecutor(geometry, model=model, grammars=compiler)
    config = EngineConfig(max_num_batched_tokens=64, speculative=speculative)
    engine = Engine(executor, FakeTokenizer(), config, grammars=compiler, observer=observer)
    return engine, executor, compiler


def choose(*choices: str) -> GrammarSpec:
    return GrammarSpec(GrammarKind.CHOICE, json.dumps(choices))


def request(
    name: str,
    prompt: Sequence[int] = PROMPT,
    *,
    grammar=None,
    n: int = 1,
    logprobs: bool = True,
    **params,
):
    settings = {"max_tokens": 20, "temperature": 0.0, **params}
    return EngineRequest(
        name,
        tuple(prompt),
        SamplingParams(**settings),
        n,
        logprobs=LogprobAsk(wanted=True, count=3) if logprobs else LogprobAsk(),
        grammar=grammar if grammar is not None else choose(*CHOICES),
    )


def run(engine: Engine, requests: list[EngineRequest]) -> dict[str, dict[int, dict]]:
    """Per request, per choice: tokens, text, entries and finish."""
    found: dict[str, dict[int, dict]] = {}
    for request_id, items in drain(engine, requests).items():
        choices: dict[int, dict] = {}
        for item in items:
            if isinstance(item, ChoiceDelta):
                choice = choices.setdefault(
                    item.index, {"tokens": [], "text": "", "entries": [], "finish": None}
                )
                choice["tokens"] += item.token_ids
                choice["text"] += item.text
                choice["entries"] += [e.position for e in item.logprobs]
                choice["finish"] = item.finish_reason or choice["finish"]
        found[request_id] = choices
    return found


def test_every_constrained_choice_is_one_of_the_choices_and_ends_with_stop():
    engine, _, _ = make_engine()
    requests = [request(f"r{i}", (i + 3, 2 * i + 5, 7), n=2) for i in range(6)]

    found = run(engine, requests)

    for choices in found.values():
        for choice in choices.values():
            assert choice["text"] in CHOICES and choice["finish"] == "stop", choice
            assert choice["tokens"][-1] == FAKE_EOS


def test_entries_are_the_unmasked_distribution_of_every_sampled_token():
    engine, _, _ = make_engine()

    (choice,) = run(engine, [request("r", PROMPT)])["r"].values()

    context = list(PROMPT)
    overruled = 0
    # The terminating EOS has no entry, as without a grammar.
    assert len(choice["entries"]) == len(choice["tokens"]) - 1
    for token_id, entry in zip(choice["tokens"], choice["entries"], strict=False):
        raw = fake_logprobs(context, 64)
        assert entry.chosen.token_id == token_id and entry.chosen.logprob == raw[token_id]
        assert [a.logprob for a in entry.alternatives[:3]] == sorted(raw, reverse=True)[:3]
        overruled += next_token(context, 64) != token_id
        context.append(token_id)
    assert overruled > 0  # the grammar chose against the model, and the values stayed raw


def test_a_complete_output_ends_at_eos_even_under_ignore_eos():
    engine, _, _ = make_engine()

    (choice,) = run(engine, [request("r", ignore_eos=True)])["r"].values()

    assert choice["text"] in CHOICES and choice["finish"] == "stop"


def test_min_tokens_never_keeps_a_complete_output_from_ending():
    engine, _, _ = make_engine()

    (choice,) = run(engine, [request("r", min_tokens=10, grammar=choose("ab"))])["r"].values()

    assert choice["text"] == "ab" and choice["finish"] == "stop"


def test_an_output_that_cannot_finish_within_max_tokens_ends_with_length():
    engine, _, _ = make_engine()

    (choice,) = run(engine, [request("r", max_tokens=3, grammar=choose("abcdefgh"))])["r"].values()

    assert choice["text"] == "abc" and choice["finish"] == "length"


def test_preempted_constrained_choices_resume_their_grammar_with_the_same_outputs():
    requests = [
        request(f"r{i}", tuple(range(i + 1, i + 12)), n=2, grammar=choose("abcdefghij", "deed"))
        for i in range(6)
    ]
    roomy, _, _ = make_engine()
    expected = run(roomy, requests)

    steps = RecordingObserver()
    tight, _, _ = make_engine(num_blocks=26, observer=steps)
    found = run(tight, requests)

    assert steps.total("preemptions") > 0
    assert found == expected


def copier(context: Sequence[int], vocab_size: int) -> int:
    """Repeats the context with period 3, so history drafts keep coming."""
    return context[-3] if len(context) >= 3 else next_token(context, vocab_size)


def test_speculation_under_a_grammar_emits_what_plain_decoding_emits():
    # The prompt's letters are "abc"; the copier proposes more of them, which the grammar takes
    # for a while and then forbids, where the word turns to "xyz".
    grammar = choose("abcabcabcabcxyz", "abcabcabcabcabcq")
    requests = [request(f"r{i}", (1, 2, 3) * (i + 2), grammar=grammar) for i in range(4)]
    plain, _, _ = make_engine(model=copier)
    expected = run(plain, requests)
    ngram = SpeculativeConfig(SpeculativeMethod.NGRAM, 4, 1, 3)

    engine, executor, _ = make_engine(model=copier, speculative=ngram)
    found = run(engine, requests)

    assert found == expected
    records = [
        r for result in executor.results for r in result.records if r.role is Role.SPECULATIVE
    ]
    assert sum(r.drafts_accepted for r in records) > 10
    assert any(r.drafts_accepted < r.drafts_offered for r in records)
    for choices in found.values():
        assert choices[0]["text"] in grammar.source


def test_a_spec_the_compiler_refuses_is_a_400_before_admission():
    engine, _, compiler = make_engine()
    bad = GrammarSpec(GrammarKind.REGEX, "[0-9]+", "response_format")

    with pytest.raises(InvalidRequestError) as caught:
        engine.submit(request("r", grammar=bad))

    assert caught.value.param == "response_format" and compiler.compiled == 1
    assert not engine.has_work()


def test_without_a_grammar_engine_a_constraint_is_a_400():
    geometry = fake_geometry(logprobs=NO_LOGPROBS, capacity=2, block_size=2, max_model_len=48)
    engine = Engine(FakeExecutor(geometry), FakeTokenizer())

    with pytest.raises(InvalidRequestError, match="grammar engine") as caught:
        engine.check(request("r", grammar=choose("ab"), logprobs=False))

    assert caught.value.param == "structured_outputs"
