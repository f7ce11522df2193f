"""lm-evaluation-harness `local-completions` against real gunicorn: transformers' loglikelihoods."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import transformers
from lm_eval.api.instance import Instance
from lm_eval.models.openai_completions import LocalCompletionsAPI

from tests.e2e.conftest import MAX_MODEL_LEN, RunningServer, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SERVED_NAME = "tiny-llama"
ATOL = 1e-4
GREEDY_LENGTH = 3
# Human text the random tiny model would not pick; the reference, not this comment, decides
# is_greedy, and the `expected` fixture insists both answers occur.
WRITTEN_PAIRS = (
    ("the quick brown fox", " jumps over the lazy dog"),
    ("every request gets its own", " slot"),
    ("Привет", " мир 日本語"),
    # lm-eval scores an empty context after the tokenizer's BOS.
    ("", " café naïve"),
)
# Contexts tried in turn until the model's greedy continuation survives a decode/encode round
# trip, so the string-prompt path scores the very tokens the model chose.
GREEDY_CONTEXTS = (
    "the quick brown fox",
    "every request gets its own",
    "nothing stale leaks into",
    "a new answer",
    "server to client",
)


@dataclass(frozen=True)
class Expected:
    """One (context, continuation) pair and what transformers says lm-eval should report."""

    context: str
    continuation: str
    logprob: float
    is_greedy: bool


class Reference:
    """The tiny model in transformers, scoring token IDs in float64 log_softmax."""

    def __init__(self, model_dir: Path) -> None:
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32
        ).eval()

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def split(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """lm-eval's split: the context alone, then the rest of the whole text's encoding
        (an empty context becomes the BOS token)."""
        if not context:
            return [self.tokenizer.bos_token_id], self.encode(continuation)
        context_ids = self.encode(context)
        whole = self.encode(context + continuation)
        if whole[: len(context_ids)] != context_ids:
            raise ValueError(f"{context!r} does not tokenize as a prefix of its continuation")
        return context_ids, whole[len(context_ids) :]

    def score(self, context: str, continuation: str) -> Expected:
        context_ids, continuation_ids = self.split(context, continuation)
        token_ids = context_ids + continuation_ids
        # The server re-tokenizes string prompts: they must come back as the same IDs.
        if self.encode(self.tokenizer.decode(token_ids)) != token_ids:
            raise ValueError(f"{context + continuation!r} does not survive decode/encode")
        with torch.no_grad():
            logits = self.model(torch.tensor([token_ids])).logits[0]
        logprobs = torch.log_softmax(logits.double(), dim=-1)
        # Row `position - 1` predicts the token at `position`.
        rows = range(len(context_ids) - 1, len(token_ids) - 1)
        chosen = [logprobs[row, token_ids[row + 1]].item() for row in rows]
        greedy = all(int(logprobs[row].argmax()) == token_ids[row + 1] for row in rows)
        return Expected(context, continuation, sum(chosen), greedy)

    def greedy_continuation(self, context: str) -> str | None:
        context_ids = self.encode(context)
        with torch.no_grad():
            generated = self.model.generate(
                torch.tensor([context_ids]),
                max_new_tokens=GREEDY_LENGTH,
                min_new_tokens=GREEDY_LENGTH,
                do_sample=False,
            )[0, len(context_ids) :].tolist()
        text = self.tokenizer.decode(generated)
        if self.encode(context + text) != context_ids + generated:
            return None
        return text


@pytest.fixture(scope="module")
def expected(e2e_model_dir: Path) -> list[Expected]:
    reference = Reference(e2e_model_dir)
    greedy = next(
        (
            (context, text)
            for context in GREEDY_CONTEXTS
            if (text := reference.greedy_continuation(context)) is not None
        ),
        None,
    )
    if greedy is None:
        raise ValueError("no context's greedy continuation survives decode/encode")
    cases = [reference.score(c, t) for c, t in (*WRITTEN_PAIRS, greedy)]
    # Both answers of is_greedy must be on the line, or the comparison proves little.
    if sorted({case.is_greedy for case in cases}) != [False, True]:
        raise ValueError(f"the cases do not mix greedy and non-greedy: {cases}")
    return cases


@pytest.fixture(scope="module")
def scoring_server(
    e2e_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    workdir = tmp_path_factory.mktemp("lm-eval-server")
    flags = ("--served-model-name", SERVED_NAME, "--prompt-logprobs")
    with running_server(e2e_model_dir, workdir, *flags) as running:
        yield running


def local_completions(
    server: RunningServer, model_dir: Path, **model_args: object
) -> LocalCompletionsAPI:
    return LocalCompletionsAPI(
        base_url=f"{server.base_url}/v1/completions",
        model=SERVED_NAME,
        tokenizer=str(model_dir),
        tokenizer_backend="huggingface",
        max_length=MAX_MODEL_LEN,
        # One try: a refused request should fail the test at once, not after back-off sleeps.
        max_retries=1,
        timeout=60,
        **model_args,
    )


def instances(cases: list[Expected]) -> list[Instance]:
    return [
        Instance("loglikelihood", doc={}, arguments=(case.context, case.continuation), idx=index)
        for index, case in enumerate(cases)
    ]


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
    e2e_model_dir: Path,
    expected: list[Expected],
    model_args: dict[str, object],
):
    model = local_completions(scoring_server, e2e_model_dir, **model_args)

    results = model.loglikelihood(instances(expected), disable_tqdm=True)

    assert len(results) == len(expected)
    for case, (logprob, is_greedy) in zip(expected, results, strict=True):
        label = f"{case.context!r} + {case.continuation!r}"
        assert logprob == pytest.approx(case.logprob, abs=ATOL), label
        assert is_greedy is case.is_greedy, label
