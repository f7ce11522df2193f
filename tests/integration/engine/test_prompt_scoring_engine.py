"""Scored prefill through the real engine and executor on a tiny model, against transformers."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
import transformers

from domain.common.errors import InvalidRequestError
from domain.contract.capabilities import LogprobCapability, scored_capacities
from domain.emission.outputs import ChoiceDelta, PromptScores
from domain.logprobs.rules import LogprobAsk
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams
from tests.fakes import RecordingObserver
from tests.support.draining import drain, ended_items, step_until_idle
from tests.support.engines import build_engine

pytestmark = pytest.mark.model

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=6, temperature=0.9, seed=1234, ignore_eos=True)


def make_engine(
    model_dir: Path, *, budget: int, scoring: bool = True, max_model_len: int = 256, **sizes
):
    """(engine, plans) with scored capacities for `budget`, or none when not `scoring`."""
    capability = LogprobCapability(
        top_k=20, selects_ids=True, scored_capacities=scored_capacities(budget) if scoring else ()
    )
    engine, _, plans = build_engine(
        model_dir, budget=budget, max_model_len=max_model_len, capability=capability, **sizes
    )
    return engine, plans


def scores_of(items: list) -> list[tuple[int, object]]:
    """(position, score) for every published score, in publication order."""
    published = []
    for item in items:
        if isinstance(item, PromptScores):
            published += [(item.first_position + i, s) for i, s in enumerate(item.scores)]
    return published


def tokens_of(items: list, index: int = 0) -> list[int]:
    return [
        t for i in items if isinstance(i, ChoiceDelta) and i.index == index for t in i.token_ids
    ]


def random_prompt(length: int, seed: int, vocab: int) -> tuple[int, ...]:
    generator = random.Random(seed)
    return tuple(generator.randrange(vocab) for _ in range(length))


@pytest.fixture(scope="module")
def reference_model(tiny_model_dir: Path):
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    return model.eval()


def reference_scores(model, prompt: tuple[int, ...]) -> torch.Tensor:
    """float64 log_softmax of transformers' logits: row r scores position r + 1."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0]
    return logits.double().log_softmax(dim=-1)


def assert_scores_match(model, prompt: tuple[int, ...], published: list, vocab: int) -> None:
    assert [position for position, _ in published] == list(range(1, len(prompt)))
    expected = reference_scores(model, prompt)[:, :vocab]
    for position, score in published:
        row = expected[position - 1]
        actual = prompt[position]
        assert score.token_id == actual
        assert score.logprob == pytest.approx(row[actual].item(), abs=1e-4)
        assert score.rank == 1 + int((row > row[actual]).sum())
        best = torch.argsort(row, descending=True, stable=True)[:20].tolist()
        assert [a.token_id for a in score.alternatives] == best
        for alternative in score.alternatives:
            assert alternative.logprob == pytest.approx(row[alternative.token_id].item(), abs=1e-4)


@pytest.mark.parametrize(
    ("budget", "lengths"),
    [(32, (5, 70, 100)), (200, (60, 190))],
    ids=["chunks-of-32", "capacities-128-and-200"],
)
def test_scores_equal_float64_log_softmax_across_chunks_and_capacities(
    tiny_model_dir, reference_model, budget, lengths
):
    engine, plans = make_engine(tiny_model_dir, budget=budget)
    prompts = {f"p{n}": random_prompt(n, n, engine.vocab_size) for n in lengths}
    requests = [
        EngineRequest(name, prompt, GREEDY, logprobs=LogprobAsk(prompt_logprobs=5))
        for name, prompt in prompts.items()
    ]
    found = drain(engine, requests)
    for name, prompt in prompts.items():
        assert_scores_match(reference_model, prompt, scores_of(found[name]), engine.vocab_size)
    scored = [plan for plan in plans if plan.scored]
    assert scored and all(plan.num_tokens <= budget for plan in scored)
    rows = {plan.num_tokens for plan in scored}
    if budget == 200:
        assert any(n <= 128 for n in rows) and any(n > 128 for n in rows)
    else:
        assert max(lengths) > budget  # the long prompts were scored over several chunks


def test_scored_and_ordinary_requests_for_one_prompt_generate_identical_tokens(tiny_model_dir):
    engine, plans = make_engine(tiny_model_dir, budget=32)
    prompt = random_prompt(45, 7, engine.vocab_size)
    requests = [
        EngineRequest("scored-greedy", prompt, GREEDY, logprobs=LogprobAsk(prompt_logprobs=0)),
        EngineRequest("plain-greedy", prompt, GREEDY),
        EngineRequest("scored-seeded", prompt, SEEDED, n=2, logprobs=LogprobAsk(prompt_logprobs=1)),
        EngineRequest("plain-seeded", prompt, SEEDED, n=2),
    ]
    found = drain(engine, requests)
    assert tokens_of(found["scored-greedy"]) == tokens_of(found["plain-greedy"])
    for index in (0, 1):
        assert tokens_of(found["scored-seeded"], index) == tokens_of(found["plain-seeded"], index)
        assert len(tokens_of(found["scored-seeded"], index)) == 6
    assert any(plan.scored for plan in plans) and any(not plan.scored for plan in plans)


def test_scored_plans_never_carry_ordinary_lanes(tiny_model_dir):
    engine, plans = make_engine(tiny_model_dir, budget=32)
    plain = random_prompt(40, 3, engine.vocab_size)
    scored = random_prompt(40, 4, engine.vocab_size)
    drain(
        engine,
        [
            EngineRequest("plain", plain, GREEDY),
            EngineRequest("scored", scored, GREEDY, logprobs=LogprobAsk(prompt_logprobs=2)),
        ],
    )

    def prompt_rows(prompt: tuple[int, ...], kind: bool) -> int:
        """Prompt rows of `prompt` fed by plans whose `scored` flag is `kind`."""
        return sum(
            len(work.token_ids)
            for plan in plans
            if plan.scored == kind
            for work in plan.works
            if work.end_position <= 40
            and work.token_ids == prompt[work.start_position : work.end_position]
        )

    scored_plans = [index for index, plan in enumerate(plans) if plan.scored]
    assert scored_plans, "no scored step ran"
    # Every lane of a scored step is a chunk of the scored prompt, and all of it ran there.
    assert all(
        work.token_ids == scored[work.start_position : work.end_position]
        for index in scored_plans
        for work in plans[index].works
    )
    assert prompt_rows(scored, True) == 40 and prompt_rows(scored, False) == 0
    # The plain prompt ran in ordinary steps only, some of them while scoring was under way.
    assert prompt_rows(plain, False) == 40 and prompt_rows(plain, True) == 0
    assert any(not plans[i].scored for i in range(scored_plans[0], scored_plans[-1]))


def test_every_choice_outputs_only_after_the_whole_prompt_is_scored(tiny_model_dir):
    engine, _ = make_engine(tiny_model_dir, budget=16)
    prompt = random_prompt(50, 11, engine.vocab_size)
    items = drain(
        engine, [EngineRequest("r", prompt, SEEDED, n=3, logprobs=LogprobAsk(prompt_logprobs=1))]
    )["r"]
    last_score = max(i for i, item in enumerate(items) if isinstance(item, PromptScores))
    first_output = min(
        i for i, item in enumerate(items) if isinstance(item, ChoiceDelta) and item.token_ids
    )
    assert last_score < first_output
    assert len(scores_of(items)) == 49


def test_readmission_after_preemption_finishes_the_scores_without_duplicates(
    tiny_model_dir, reference_model
):
    # 40 blocks of 4 positions: two 100-token prompts cannot both stay resident.
    steps = RecordingObserver()
    engine, plans = make_engine(
        tiny_model_dir,
        budget=24,
        kv_bytes=40 * 4 * 512,
        block_size=4,
        max_model_len=128,
        observer=steps,
    )
    prompts = {name: random_prompt(100, seed, engine.vocab_size) for seed, name in enumerate("ab")}
    requests = [
        EngineRequest(name, prompt, GREEDY, logprobs=LogprobAsk(prompt_logprobs=3))
        for name, prompt in prompts.items()
    ]
    channels = {r.request_id: engine.submit(r) for r in requests}
    step_until_idle(engine)
    found = ended_items(channels)
    assert steps.total("preemptions") > 0, "the pool was meant to force a preemption"
    for name, prompt in prompts.items():
        assert_scores_match(reference_model, prompt, scores_of(found[name]), engine.vocab_size)
    alone, _ = make_engine(tiny_model_dir, budget=24)
    for name, prompt in prompts.items():
        solo = drain(alone, [EngineRequest(name, prompt, GREEDY)])[name]
        assert tokens_of(found[name]) == tokens_of(solo)


def test_zero_output_budget_scores_the_prompt_and_generates_nothing(
    tiny_model_dir, reference_model
):
    engine, plans = make_engine(tiny_model_dir, budget=32)
    prompt = random_prompt(60, 5, engine.vocab_size)
    request = EngineRequest(
        "echo", prompt, GREEDY, n=2, logprobs=LogprobAsk(prompt_logprobs=1), prefill_only=True
    )
    items = drain(engine, [request])["echo"]
    assert_scores_match(reference_model, prompt, scores_of(items), engine.vocab_size)
    deltas = [item for item in items if isinstance(item, ChoiceDelta)]
    assert sorted(d.index for d in deltas if d.finished) == [0, 1]
    assert all(d.finish_reason == "length" and not d.token_ids for d in deltas if d.finished)
    assert not any(work.sample for plan in plans for work in plan.works)
    assert items[-1].usage.completion_tokens == 0


def test_one_token_prompt_has_nothing_to_score_and_still_generates(tiny_model_dir):
    engine, _ = make_engine(tiny_model_dir, budget=32)
    items = drain(
        engine, [EngineRequest("one", (7,), GREEDY, logprobs=LogprobAsk(prompt_logprobs=0))]
    )["one"]
    assert scores_of(items) == []
    assert len(tokens_of(items)) == 6


def test_engine_without_scoring_rejects_prompt_logprob_requests(tiny_model_dir):
    engine, _ = make_engine(tiny_model_dir, budget=32, scoring=False)
    with pytest.raises(InvalidRequestError) as caught:
        engine.submit(EngineRequest("r", (1, 2, 3), GREEDY, logprobs=LogprobAsk(prompt_logprobs=1)))
    assert caught.value.param == "prompt_logprobs"
    with pytest.raises(InvalidRequestError):
        engine_with, _ = make_engine(tiny_model_dir, budget=32)
        engine_with.submit(
            EngineRequest("r", (1, 2, 3), GREEDY, logprobs=LogprobAsk(prompt_logprobs=21))
        )


def test_a_scored_request_reports_generation_logprobs_through_the_completion_contract(
    tiny_model_dir,
):
    engine, _ = make_engine(tiny_model_dir, budget=32)
    prompt = random_prompt(40, 9, engine.vocab_size)
    found = drain(
        engine,
        [
            EngineRequest(
                "s", prompt, GREEDY, logprobs=LogprobAsk(wanted=True, count=3, prompt_logprobs=3)
            ),
            EngineRequest("o", prompt, GREEDY, logprobs=LogprobAsk(wanted=True, count=3)),
        ],
    )

    def entries(items):
        return [e.position for i in items if isinstance(i, ChoiceDelta) for e in i.logprobs]

    scored, ordinary = entries(found["s"]), entries(found["o"])
    assert len(scored) == len(ordinary) == 6
    for mine, theirs in zip(scored, ordinary, strict=True):
        # Same tokens; values agree to rounding (the two ran in differently sized batches).
        assert mine.chosen.token_id == theirs.chosen.token_id
        assert mine.chosen.logprob == pytest.approx(theirs.chosen.logprob, abs=1e-5)
        assert [a.token_id for a in mine.alternatives][:3] == [
            a.token_id for a in theirs.alternatives
        ][:3]


def test_requests_without_prompt_logprobs_never_select_the_scored_operation(tiny_model_dir):
    engine, plans = make_engine(tiny_model_dir, budget=32)
    prompt = random_prompt(70, 13, engine.vocab_size)
    asked = LogprobAsk(wanted=True, count=2)
    drain(engine, [EngineRequest("plain", prompt, GREEDY, n=2, logprobs=asked)])
    assert plans and not any(plan.scored for plan in plans)


def test_an_executor_without_scored_capacities_keeps_no_scoring_storage(tiny_model_dir):
    engine, _ = make_engine(tiny_model_dir, budget=32, scoring=False)
    executor = engine._executor  # noqa: SLF001 - the storage is private by design
    assert executor.geometry.logprobs.scored_capacities == ()
    assert executor._scores is None  # noqa: SLF001
