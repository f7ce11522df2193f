"""Tensor parallelism on 2 and 3 gloo ranks serves what one rank serves, logprobs included.

The model splits unevenly everywhere (6 query heads over 3 key/value heads, 160 MLP columns, a
2500-token vocabulary in three normalizer tiles), carries the o_proj and down_proj biases that
join after the all-reduce, and runs the real engine on rank 0 with peers running every plan.
"""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from adapters.gpu.background_executor import BackgroundExecutor
from adapters.gpu.distributed.group import Rendezvous
from adapters.gpu.distributed.shards import shard_range
from adapters.gpu.factory import ExecutorRecipe
from adapters.gpu.logprobs.reference_reducer_vp import EXCHANGE_WORDS as LOGPROB_WORDS
from adapters.grammar.llguidance_compiler import LlguidanceCompiler
from adapters.tokenizer.hf import HfTokenizer
from domain.contract.capabilities import LogprobCapability, scored_capacities
from domain.emission.outputs import ChoiceDelta, PromptScores
from domain.engine.engine import Engine, EngineConfig
from domain.logprobs.rules import LogprobAsk
from domain.logprobs.values import MAX_SELECTED_IDS, NATURAL_TOP_K, bits_to_float
from domain.reasoning.thinking import ThinkingBudget, ThinkingMarkers
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams
from domain.speculation.drafts import SpeculativeConfig, SpeculativeMethod
from domain.structured.grammar import GrammarKind, GrammarSpec
from tests.support import parallel_world as world
from tests.support.draining import drain
from tests.support.tiny_serving import (
    PARALLEL_VOCAB,
    build_draft_model_dir,
    build_parallel_model_dir,
)

pytestmark = [pytest.mark.model, pytest.mark.slow]

BUDGET = 32
CAPABILITY = LogprobCapability(
    top_k=NATURAL_TOP_K, selects_ids=True, scored_capacities=scored_capacities(BUDGET)
)
NGRAM = SpeculativeConfig(SpeculativeMethod.NGRAM, 4, 1, 3)
# Summation order differs between splits, so values agree to FP32 noise, not bit for bit.
SPLIT_NOISE = 5e-5
# One FP32 `logit - lse` against float64 log_softmax of the same FP32 row.
FP32_ROUNDING = 4e-6
# 128 IDs over every shard of 2 and 3 ranks, both ends of the vocabulary included.
SELECTED = tuple(range(0, PARALLEL_VOCAB, 19))[: MAX_SELECTED_IDS - 1] + (PARALLEL_VOCAB - 1,)


def _prompts(tokenizer: HfTokenizer) -> list[tuple[int, ...]]:
    texts = ["the quick brown fox", "bako lemi tu sira", "every request gets its own slot"]
    encoded = [tuple(tokenizer.encode(text)) for text in texts]
    generator = random.Random(5)
    phrase = [generator.randrange(3, PARALLEL_VOCAB) for _ in range(5)]
    encoded.append(tuple(phrase * 4))  # repetitive: n-gram drafts get accepted
    encoded.append(tuple(generator.randrange(3, PARALLEL_VOCAB) for _ in range(40)))
    return encoded


def _requests(tokenizer: HfTokenizer) -> list[EngineRequest]:
    prompts = _prompts(tokenizer)
    top20 = LogprobAsk(wanted=True, count=NATURAL_TOP_K)
    greedy = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    requests = [
        EngineRequest(f"greedy{i}", p, greedy, logprobs=top20) for i, p in enumerate(prompts)
    ]
    # Bias and bans on IDs of every shard; penalties count tokens in every shard.
    edited = SamplingParams(
        temperature=0.8,
        top_k=50,
        min_p=0.02,
        presence_penalty=0.4,
        frequency_penalty=0.3,
        repetition_penalty=1.2,
        logit_bias=((7, 3.0), (1500, 2.5), (2400, 4.0)),
        max_tokens=16,
        ignore_eos=True,
        seed=11,
    )
    requests += [
        EngineRequest(f"sampled{i}", p, edited, n=2, logprobs=LogprobAsk(wanted=True, count=5))
        for i, p in enumerate(prompts[:3])
    ]
    one = LogprobAsk(wanted=True, token_ids=(PARALLEL_VOCAB - 2,))
    many = LogprobAsk(wanted=True, token_ids=SELECTED)
    requests.append(EngineRequest("select1", prompts[0], greedy, logprobs=one))
    requests.append(EngineRequest("select128", prompts[1], greedy, logprobs=many))
    scored = LogprobAsk(wanted=True, count=3, prompt_logprobs=NATURAL_TOP_K, echo=True)
    requests.append(EngineRequest("prompt", prompts[4], greedy, logprobs=scored))
    # A prompt that ends with the start marker opens a block; after 3 tokens its end is forced.
    thinking = ThinkingBudget(3, ThinkingMarkers(start=(prompts[2][-1],), end=FORCED_END))
    for name, params in (("think-greedy", greedy), ("think-sampled", edited)):
        requests.append(EngineRequest(name, prompts[2], params, logprobs=top20, thinking=thinking))
    # Constrained lanes: every rank masks its shard with its own matcher's words.
    for name, params in (("choice-greedy", greedy), ("choice-sampled", edited)):
        requests.append(EngineRequest(name, prompts[0], params, logprobs=top20, grammar=CHOICE))
    requests.append(EngineRequest("regex-sampled", prompts[3], edited, grammar=REGEX))
    return requests


# The forced end of a thinking block: two IDs in rank 0's shard.
FORCED_END = (5, 6)
CHOICES = ["bako lemi", "tu sira", "every"]
CHOICE = GrammarSpec(GrammarKind.CHOICE, json.dumps(CHOICES))
REGEX = GrammarSpec(GrammarKind.REGEX, "[a-z]{3,8}( [a-z]{2,6})?")


def _top_p_requests(tokenizer: HfTokenizer) -> list[EngineRequest]:
    nucleus = SamplingParams(temperature=1.0, top_p=0.7, max_tokens=8, ignore_eos=True, seed=3)
    return [EngineRequest(f"nucleus{i}", p, nucleus) for i, p in enumerate(_prompts(tokenizer))]


def _outputs(items: list) -> dict[str, Any]:
    """Per choice: tokens, (ID, logprob) of every chosen and alternative entry, prompt rows."""
    found: dict[str, Any] = {}
    for item in items:
        if isinstance(item, ChoiceDelta):
            choice = found.setdefault(item.index, {"tokens": [], "entries": []})
            choice["tokens"] += item.token_ids
            for entry in item.logprobs:
                position = entry.position
                pairs = [(p.token_id, p.logprob) for p in (position.chosen, *position.alternatives)]
                choice["entries"].append(pairs)
        elif isinstance(item, PromptScores):
            rows = [
                [(score.token_id, score.logprob, score.rank)]
                + [(a.token_id, a.logprob) for a in score.alternatives]
                for score in item.scores
            ]
            found.setdefault("prompt", []).extend(rows)
    return found


def _drive(executor, tokenizer: HfTokenizer) -> dict[str, Any]:
    """What rank 0 serves: plain, top-p and n-gram-speculative runs over one executor."""
    results: dict[str, Any] = {}
    runs = {
        "plain": (None, _requests(tokenizer)),
        "top_p": (None, _top_p_requests(tokenizer)),
        "speculative": (NGRAM, _requests(tokenizer)),
    }
    for run, (speculative, requests) in runs.items():
        config = EngineConfig(
            max_num_seqs=8, max_num_batched_tokens=BUDGET, speculative=speculative
        )
        engine = Engine(executor, tokenizer, config, grammars=LlguidanceCompiler(tokenizer))
        drained = drain(engine, requests)
        results[run] = {name: _outputs(items) for name, items in drained.items()}
    # The overlapped loop: rank 0's plans carry placeholders every rank fills from its records.
    overlapped = BackgroundExecutor(executor)
    config = EngineConfig(max_num_seqs=8, max_num_batched_tokens=BUDGET, async_scheduling=True)
    engine = Engine(overlapped, tokenizer, config, grammars=LlguidanceCompiler(tokenizer))
    drained = drain(engine, _requests(tokenizer))
    overlapped.close()
    results["overlapped"] = {name: _outputs(items) for name, items in drained.items()}
    return results


def _recipe(
    model_dir: Path, tensor_parallel_size: int, draft_dir: Path | None = None
) -> ExecutorRecipe:
    tokenizer = HfTokenizer.from_dir(model_dir)
    return ExecutorRecipe(
        model_dir,
        world.settings(tensor_parallel_size),
        tokenizer.vocab_size,
        capability=CAPABILITY,
        draft_dir=draft_dir,
        structured_outputs=True,
    )


def _drafting(draft_dir: Path) -> SpeculativeConfig:
    return SpeculativeConfig(SpeculativeMethod.DRAFT_MODEL, 3, model=str(draft_dir))


def _drive_drafts(executor, tokenizer: HfTokenizer, draft_dir: Path) -> dict[str, Any]:
    """Greedy and seeded requests proposed by a draft model (a whole copy on every rank)."""
    config = EngineConfig(
        max_num_seqs=8, max_num_batched_tokens=BUDGET, speculative=_drafting(draft_dir)
    )
    requests = [r for r in _requests(tokenizer) if not r.logprobs.prompt_logprobs]
    accepted: list[int] = []

    class Acceptance:
        def record_step(self, stats) -> None:
            accepted.append(stats.spec_accepted_tokens)

    grammars = LlguidanceCompiler(tokenizer)
    engine = Engine(executor, tokenizer, config, observer=Acceptance(), grammars=grammars)
    drained = drain(engine, requests)
    return {
        "outputs": {name: _outputs(items) for name, items in drained.items()},
        "accepted": sum(accepted),
    }


def _draft_rank_main(
    rendezvous: Rendezvous, directory: Path, model_dir: Path, draft_dir: Path
) -> None:
    if rendezvous.rank:
        world.peer(rendezvous, directory)
        return
    tokenizer = HfTokenizer.from_dir(model_dir)
    recipe = _recipe(model_dir, rendezvous.world_size, draft_dir)
    served = world.coordinate(
        rendezvous, recipe, lambda executor: _drive_drafts(executor, tokenizer, draft_dir)
    )
    world.save(directory, "served", served)


def _rank_main(rendezvous: Rendezvous, directory: Path, model_dir: Path) -> None:
    capture = world.ReductionCapture()
    capture.install()
    if rendezvous.rank:
        world.peer(rendezvous, directory)
    else:
        tokenizer = HfTokenizer.from_dir(model_dir)
        recipe = _recipe(model_dir, rendezvous.world_size)

        def drive(executor):
            served = _drive(executor, tokenizer)
            return served, executor.collectives.tally

        served, tally = world.coordinate(rendezvous, recipe, drive)
        world.save(directory, "served", served)
        world.save(directory, "tally0", tally)
    world.save(directory, f"capture{rendezvous.rank}", capture.calls)
    world.save(directory, f"scored{rendezvous.rank}", capture.scored_rows)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("parallel-model")
    return build_parallel_model_dir(directory, attention_bias=True, mlp_bias=True)


@pytest.fixture(scope="module")
def single(model_dir) -> dict[str, Any]:
    tokenizer = HfTokenizer.from_dir(model_dir)
    return _drive(_recipe(model_dir, 1).build(), tokenizer)


@pytest.fixture(scope="module", params=[2, 3], ids=["tp2", "tp3"])
def split(request, model_dir, tmp_path_factory) -> tuple[int, Path]:
    directory = tmp_path_factory.mktemp(f"tp{request.param}")
    world.spawn_world(request.param, directory, _rank_main, model_dir)
    return request.param, directory


def _served(split) -> dict[str, Any]:
    return world.load(split[1], "served")


def _close(left: list, right: list, tolerance: float) -> bool:
    return all(
        a[0] == b[0] and abs(a[1] - b[1]) <= tolerance for a, b in zip(left, right, strict=True)
    )


def test_greedy_and_seeded_tokens_are_identical_to_one_rank(single, split):
    served = _served(split)
    for run in ("plain", "top_p", "speculative", "overlapped"):
        for name, choices in single[run].items():
            for index, choice in choices.items():
                if index == "prompt":
                    continue
                assert served[run][name][index]["tokens"] == choice["tokens"], (run, name, index)


def test_the_overlapped_loop_serves_what_the_synchronous_loop_serves_on_every_split(split):
    served = _served(split)
    for name, choices in served["plain"].items():
        for index, choice in choices.items():
            overlapped = served["overlapped"][name][index]
            if index == "prompt":
                assert overlapped == choice, name
                continue
            assert overlapped["tokens"] == choice["tokens"], (name, index)
            pairs = zip(overlapped["entries"], choice["entries"], strict=True)
            assert all(_close(left, right, 1e-5) for left, right in pairs), (name, index)


def test_a_thinking_budget_forces_the_same_end_on_every_rank_without_entries(single, split):
    served = _served(split)
    for run in ("plain", "speculative"):
        for name in ("think-greedy", "think-sampled"):
            choice = served[run][name][0]
            assert choice["tokens"][3:5] == list(FORCED_END), (run, name)
            # Every token but the two forced ones has its entry, as on one rank.
            assert len(choice["entries"]) == len(choice["tokens"]) - 2
            assert choice["tokens"] == single[run][name][0]["tokens"]


def test_constrained_lanes_follow_their_grammar_on_every_split(single, split, model_dir):
    tokenizer = HfTokenizer.from_dir(model_dir)
    served = _served(split)
    for run in ("plain", "speculative"):
        for name in ("choice-greedy", "choice-sampled", "regex-sampled"):
            tokens = served[run][name][0]["tokens"]
            text = tokenizer.decode([t for t in tokens if t not in tokenizer.eos_token_ids])
            if name.startswith("choice"):
                assert text in CHOICES, (run, name, text)
            else:
                assert re.fullmatch(REGEX.source, text), (run, name, text)
            assert tokens == single[run][name][0]["tokens"], (run, name)


def test_reported_ids_match_and_values_agree_within_split_noise(single, split):
    served = _served(split)
    checked = 0
    for name, choices in single["plain"].items():
        for index, choice in choices.items():
            if index == "prompt":
                continue
            ours = served["plain"][name][index]["entries"]
            assert len(ours) == len(choice["entries"])
            for mine, theirs in zip(ours, choice["entries"], strict=True):
                assert [p[0] for p in mine] == [p[0] for p in theirs], (name, index)
                assert _close(mine, theirs, SPLIT_NOISE), (name, index)
                checked += 1
    assert checked > 150


def test_top_20_alternatives_and_selected_ids_are_reported_in_full(split):
    served = _served(split)["plain"]
    for index in range(5):
        for entry in served[f"greedy{index}"][0]["entries"]:
            assert len(entry) == 1 + NATURAL_TOP_K
    for entry in served["select1"][0]["entries"]:
        assert [pair[0] for pair in entry[1:]] == [PARALLEL_VOCAB - 2]
    for entry in served["select128"][0]["entries"]:
        assert [pair[0] for pair in entry[1:]] == list(SELECTED)
        assert all(math.isfinite(pair[1]) for pair in entry)


def test_prompt_scores_and_ranks_equal_one_rank(single, split, model_dir):
    mine = _served(split)["plain"]["prompt"]["prompt"]
    theirs = single["plain"]["prompt"]["prompt"]
    # Every position but the first has a score.
    assert len(mine) == len(theirs) == len(_prompts(HfTokenizer.from_dir(model_dir))[4]) - 1
    for row, reference in zip(mine, theirs, strict=True):
        assert row[0][0] == reference[0][0] and row[0][2] == reference[0][2]  # target, rank
        assert abs(row[0][1] - reference[0][1]) <= SPLIT_NOISE
        assert _close(row[1:], reference[1:], SPLIT_NOISE)


def test_speculation_on_and_off_serve_the_same_greedy_tokens_and_entries(split):
    # Seeded sampling draws acceptance from its own streams, so only greedy output is equal
    # with and without drafts; seeded speculative output equals one rank's (the first test).
    served = _served(split)
    for name, choices in served["plain"].items():
        if name.startswith("sampled"):
            continue
        for index, choice in choices.items():
            if index == "prompt":
                continue
            speculative = served["speculative"][name][index]
            assert speculative["tokens"] == choice["tokens"], (name, index)
            for mine, theirs in zip(speculative["entries"], choice["entries"], strict=True):
                assert [p[0] for p in mine] == [p[0] for p in theirs]
                assert _close(mine, theirs, SPLIT_NOISE)


def _full_rows(split) -> tuple[list[dict[str, Any]], list[torch.Tensor]]:
    """Rank 0's reduction records and each reduction's logits rows over the whole vocabulary,
    joined from every rank's lanes (every rank's records are loaded once)."""
    size, directory = split
    captures = [world.load(directory, f"capture{rank}") for rank in range(size)]
    widths = [
        stop - start for start, stop in (shard_range(PARALLEL_VOCAB, size, r) for r in range(size))
    ]
    rows = [
        torch.cat(
            [
                shards[call]["logits"][:, :width]
                for shards, width in zip(captures, widths, strict=True)
            ],
            dim=1,
        )
        for call in range(len(captures[0]))
    ]
    return captures[0], rows


def test_every_reported_value_is_float64_log_softmax_of_the_full_row_within_fp32_rounding(split):
    calls, full_rows = _full_rows(split)
    checked = 0
    for call, rows in zip(calls, full_rows, strict=True):
        for row, words, chosen, count, requested in zip(
            rows, call["words"], call["chosen"], call["counts"], call["requested"], strict=True
        ):
            if not requested:
                continue
            exact = torch.log_softmax(row.double(), dim=0)
            words = words.tolist()
            assert words[0] == chosen
            pairs = [
                (words[2 + 2 * i], bits_to_float(words[3 + 2 * i]))
                for i in range(max(count, NATURAL_TOP_K))
            ]
            pairs = pairs[: count or NATURAL_TOP_K]
            for token_id, value in [(chosen, bits_to_float(words[1])), *pairs]:
                expected = exact[token_id].item()
                assert abs(value - expected) <= FP32_ROUNDING * (1 + abs(expected))
            if not count:
                best = torch.argsort(exact, descending=True, stable=True)[:NATURAL_TOP_K]
                assert [p[0] for p in pairs] == best.tolist()
            checked += 1
    assert checked > 300


def test_logprob_and_scoring_exchanges_carry_exactly_their_words_and_no_logits(split):
    size, directory = split
    calls = world.load(directory, "capture0")
    positions = sum(sum(1 for flag in call["requested"] if flag) for call in calls)
    scored_rows = world.load(directory, "scored0")
    assert scored_rows > 0
    for rank in range(size):
        tally = world.load(directory, f"tally{rank}")
        # Two all-gathers per reduction of 256 FP32 words per requesting position; start-up
        # prepares the reducer on one scratch row, with and without the selected-ID inputs.
        assert tally.words["logprobs"] == 2 * LOGPROB_WORDS * (positions + 2)
        assert tally.widest_row["logprobs"] == LOGPROB_WORDS
        # Two all-gathers of 64 int32 words per scored row.
        assert tally.words["scoring"] == 2 * 64 * scored_rows
        assert tally.widest_row["scoring"] == 64
        # Nothing as wide as a shard travels, except the counted top-p rows.
        narrowest_shard = min(
            stop - start
            for start, stop in (shard_range(PARALLEL_VOCAB, size, r) for r in range(size))
        )
        for purpose, widest in tally.widest_row.items():
            if purpose != "sampling rows gathered":
                assert widest < narrowest_shard, purpose


@pytest.fixture(scope="module")
def draft_dir(model_dir, tmp_path_factory) -> Path:
    return build_draft_model_dir(tmp_path_factory.mktemp("draft"), model_dir, noise=0.02)


def test_a_draft_model_under_two_ranks_serves_one_rank_s_tokens_and_entries(
    model_dir, draft_dir, tmp_path_factory
):
    tokenizer = HfTokenizer.from_dir(model_dir)
    single = _drive_drafts(_recipe(model_dir, 1, draft_dir).build(), tokenizer, draft_dir)
    directory = tmp_path_factory.mktemp("tp2-draft")
    world.spawn_world(2, directory, _draft_rank_main, model_dir, draft_dir)
    served = world.load(directory, "served")
    assert served["accepted"] == single["accepted"] > 20
    served, single = served["outputs"], single["outputs"]
    for name, choices in single.items():
        for index, choice in choices.items():
            assert served[name][index]["tokens"] == choice["tokens"], (name, index)
            assert all(
                _close(mine, theirs, SPLIT_NOISE)
                for mine, theirs in zip(
                    served[name][index]["entries"], choice["entries"], strict=True
                )
            )
