"""lm-evaluation-harness `local-completions` on the embedded SmolLM2, around its EOS.

SmolLM2-Instruct ends its chat answers with `<|im_end|>`. The cases are found by search: chat
prompts whose greedy answer ends within a few tokens give a one-token and a multi-token
continuation after which the greedy token is EOS, next to plain and non-greedy pairs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.gpu.loading.default_model import default_model_dir
from tests.e2e.conftest import MAX_MODEL_LEN, RunningServer, running_server
from tests.support.lm_eval import (
    Expected,
    Reference,
    assert_loglikelihoods,
    instances,
    local_completions,
    scoring_payload,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.model]

SERVED_NAME = "SmolLM2-135M-Instruct"
ENDING_LIMIT = 16
QUESTIONS = (
    "Is the sky blue? Answer yes or no.",
    "What is the capital of France?",
    "What is 2+2?",
    "Is water wet? Answer yes or no.",
)
PLAIN_PAIRS = (
    ("The capital of France is", " Paris"),
    ("The capital of France is", " Lyon"),
)


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return default_model_dir(progress=False)


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> Reference:
    return Reference(model_dir)


def chat_prompt(reference: Reference, question: str) -> str:
    messages = [{"role": "user", "content": question}]
    return reference.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )


@pytest.fixture(scope="module")
def expected(reference: Reference) -> list[Expected]:
    contexts = [chat_prompt(reference, question) for question in QUESTIONS]
    cases = [reference.score(c, t) for c, t in PLAIN_PAIRS]
    cases += reference.ending_cases(contexts, ENDING_LIMIT)
    if sorted({case.is_greedy for case in cases}) != [False, True]:
        raise ValueError(f"the cases do not mix greedy and non-greedy: {cases}")
    return cases


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    workdir = tmp_path_factory.mktemp("lm-eval-smollm2")
    flags = ("--prompt-logprobs", "--kv-cache-memory", str(64 << 20))
    with running_server(None, workdir, *flags) as server:
        yield server


def test_the_searched_prompts_make_smollm2_end_right_after_the_continuation(
    smollm2: RunningServer, reference: Reference, expected: list[Expected]
):
    ending = [case for case in expected if case.ends]
    assert [len(reference.split(c.context, c.continuation)[1]) > 1 for c in ending] == [
        False,
        True,
    ]

    for case in ending:
        prompt = sum(reference.split(case.context, case.continuation), [])
        body = scoring_payload(smollm2.base_url, SERVED_NAME, prompt)

        choice = body["choices"][0]
        assert choice["finish_reason"] == "stop" and choice["stop_reason"] is None
        assert choice["logprobs"]["tokens"][-1] == "<|im_end|>"
        assert len(choice["logprobs"]["token_logprobs"]) == len(prompt) + 1


@pytest.mark.parametrize(
    "model_args",
    [
        pytest.param({"tokenized_requests": True}, id="token-ids"),
        pytest.param({"tokenized_requests": False, "batch_size": 2}, id="string-batches"),
    ],
)
def test_smollm2_loglikelihoods_equal_transformers_float64_scores(
    smollm2: RunningServer,
    model_dir: Path,
    expected: list[Expected],
    model_args: dict[str, object],
):
    model = local_completions(smollm2.base_url, SERVED_NAME, model_dir, MAX_MODEL_LEN, **model_args)

    results = model.loglikelihood(instances(expected), disable_tqdm=True)

    assert_loglikelihoods(results, expected)
