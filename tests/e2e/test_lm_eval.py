"""lm-evaluation-harness `local-completions` against real gunicorn: transformers' loglikelihoods.

The served tiny model ends deliberately (`build_ending_model_dir`), so the cases include
continuations after which the model's greedy token is EOS: lm-eval drops the last element of
the echoed arrays, which must then be the terminating EOS's own entry.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import MAX_MODEL_LEN, RunningServer, running_server
from tests.support.http_json import post_url
from tests.support.lm_eval import (
    ATOL,
    Expected,
    Reference,
    assert_loglikelihoods,
    instances,
    local_completions,
    scoring_payload,
)
from tests.support.tiny_serving import build_ending_model_dir

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.model]

SERVED_NAME = "tiny-llama"
GREEDY_LENGTH = 3
ENDING_LIMIT = 8
# Human text the random tiny model would not pick; the reference, not this comment, decides
# is_greedy, and the `expected` fixture insists both answers occur.
WRITTEN_PAIRS = (
    ("the quick brown fox", " jumps over the lazy dog"),
    ("every request gets its own", " slot"),
    ("Привет", " мир 日本語"),
    # lm-eval scores an empty context after the tokenizer's BOS.
    ("", " café naïve"),
)
# Contexts tried in turn: for a greedy continuation that survives a decode/encode round trip
# (so the string-prompt path scores the very tokens the model chose), and for greedy runs that
# end with EOS.
CONTEXTS = (
    "the quick brown fox",
    "every request gets its own",
    "nothing stale leaks into",
    "a new answer",
    "server to client",
    "the slot gets a new fox",
    "quick answer to every client",
    "its own brown server",
    "stale request leaks",
    "the lazy fox gets into a slot",
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_ending_model_dir(tmp_path_factory.mktemp("lm-eval-ending-tiny"))


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> Reference:
    return Reference(model_dir)


@pytest.fixture(scope="module")
def expected(reference: Reference) -> list[Expected]:
    greedy = None
    for context in CONTEXTS:
        context_ids = reference.encode(context)
        generated = reference.greedy(context_ids, GREEDY_LENGTH, min_tokens=GREEDY_LENGTH)
        text = reference.decode(generated)
        if reference.encode(context + text) == context_ids + generated:
            greedy = (context, text)
            break
    if greedy is None:
        raise ValueError("no context's greedy continuation survives decode/encode")
    cases = [reference.score(c, t) for c, t in (*WRITTEN_PAIRS, greedy)]
    cases += reference.ending_cases(CONTEXTS, ENDING_LIMIT)
    # Both answers of is_greedy must be on the line, or the comparison proves little.
    if sorted({case.is_greedy for case in cases}) != [False, True]:
        raise ValueError(f"the cases do not mix greedy and non-greedy: {cases}")
    return cases


@pytest.fixture(scope="module")
def scoring_server(
    model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    workdir = tmp_path_factory.mktemp("lm-eval-server")
    flags = ("--served-model-name", SERVED_NAME, "--prompt-logprobs")
    with running_server(model_dir, workdir, *flags) as running:
        yield running


@pytest.fixture(scope="module")
def uncached_server(
    model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    workdir = tmp_path_factory.mktemp("lm-eval-uncached-server")
    flags = ("--served-model-name", SERVED_NAME, "--prompt-logprobs")
    with running_server(model_dir, workdir, *flags, "--no-enable-prefix-caching") as running:
        yield running


# Contexts of several KV blocks, so that a cache holding them could serve whole blocks.
LONG_CONTEXTS = (
    "the quick brown fox gets into a slot, " * 6,
    "every request gets its own answer from the server to the client. " * 5,
)


def test_loglikelihoods_under_a_warm_prefix_cache_equal_a_server_without_one_exactly(
    scoring_server: RunningServer,
    uncached_server: RunningServer,
    model_dir: Path,
    reference: Reference,
    expected: list[Expected],
):
    cases = [*expected, *(Expected(c, " slot", 0.0, False) for c in LONG_CONTEXTS)]
    # The same token IDs as ordinary completions first: the repeat reads them from the cache,
    # so the scored requests below find every prompt's blocks there and must not use them.
    cached = []
    for case in cases:
        prompt = sum(reference.split(case.context, case.continuation), [])
        for _ in range(2):
            body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": 1, "temperature": 0}
            usage = post_url(scoring_server.base_url, "/v1/completions", body)["usage"]
        cached.append((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))
    assert max(cached) > 0, cached

    def scores(server: RunningServer, batch_size: int) -> list[tuple[float, bool]]:
        model = local_completions(
            server.base_url,
            SERVED_NAME,
            model_dir,
            MAX_MODEL_LEN,
            tokenized_requests=True,
            batch_size=batch_size,
        )
        return model.loglikelihood(instances(cases), disable_tqdm=True)

    # Exact equality of the floats, one prompt per request and three (which share a forward, so
    # their values may differ from the single ones in the last bits, on both servers alike).
    for batch_size in (1, 3):
        assert scores(scoring_server, batch_size) == scores(uncached_server, batch_size)


def test_the_ending_cases_make_the_server_generate_a_terminating_eos(
    scoring_server: RunningServer, reference: Reference, expected: list[Expected]
):
    ending = [case for case in expected if case.ends]
    assert [len(reference.split(c.context, c.continuation)[1]) > 1 for c in ending] == [
        False,
        True,
    ]

    for case in ending:
        prompt = sum(reference.split(case.context, case.continuation), [])
        body = scoring_payload(scoring_server.base_url, SERVED_NAME, prompt)

        choice = body["choices"][0]
        assert choice["finish_reason"] == "stop" and choice["stop_reason"] is None
        assert body["usage"]["completion_tokens"] == 1
        assert len(choice["logprobs"]["token_logprobs"]) == len(prompt) + 1


@pytest.mark.parametrize(
    "model_args",
    [
        pytest.param({"tokenized_requests": True}, id="token-ids"),
        pytest.param({"tokenized_requests": False}, id="strings"),
        pytest.param({"tokenized_requests": True, "batch_size": 3}, id="token-id-batches"),
        pytest.param({"tokenized_requests": False, "batch_size": 3}, id="string-batches"),
        pytest.param({"tokenized_requests": True, "num_concurrent": 2}, id="concurrent"),
    ],
)
def test_local_completions_loglikelihoods_equal_transformers_float64_scores(
    scoring_server: RunningServer,
    model_dir: Path,
    expected: list[Expected],
    model_args: dict[str, object],
):
    model = local_completions(
        scoring_server.base_url, SERVED_NAME, model_dir, MAX_MODEL_LEN, **model_args
    )

    results = model.loglikelihood(instances(expected), disable_tqdm=True)

    assert_loglikelihoods(results, expected)


# Characters the tiny tokenizer never merged: each is several byte tokens, so the scored
# continuations hold characters split across tokens.
MULTI_TOKEN_PAIRS = (
    ("the quick brown fox", " \U0001f98a\u9f8d"),
    ("every request gets its own", " \u732b\U0001f431 slot"),
    ("\u65e5\u672c\u8a9e", " \u9f8d\u306e\U0001f409"),
)


def test_loglikelihoods_over_split_emoji_and_cjk_equal_lm_eval_hf_backend(
    scoring_server: RunningServer, model_dir: Path, reference: Reference
):
    from lm_eval.models.huggingface import HFLM

    for context, continuation in MULTI_TOKEN_PAIRS:
        _, continuation_ids = reference.split(context, continuation)
        alone = [reference.decode([token_id]) for token_id in continuation_ids]
        assert any("\ufffd" in text for text in alone), f"{continuation!r} is not split: {alone}"
    cases = [Expected(c, t, 0.0, False) for c, t in MULTI_TOKEN_PAIRS]
    local = HFLM(pretrained=str(model_dir), device="cpu", dtype="float32", batch_size=1)
    wanted = local.loglikelihood(instances(cases), disable_tqdm=True)

    for tokenized in (True, False):
        served = local_completions(
            scoring_server.base_url,
            SERVED_NAME,
            model_dir,
            MAX_MODEL_LEN,
            tokenized_requests=tokenized,
        )
        results = served.loglikelihood(instances(cases), disable_tqdm=True)
        assert len(results) == len(wanted)
        for (logprob, greedy), (hf_logprob, hf_greedy) in zip(results, wanted, strict=True):
            assert abs(logprob - hf_logprob) <= ATOL and greedy is hf_greedy
