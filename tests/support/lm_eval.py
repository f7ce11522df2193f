"""lm-evaluation-harness against a served model, and transformers' float64 answer to compare."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from lm_eval.api.instance import Instance
from lm_eval.models.openai_completions import LocalCompletionsAPI

from tests.support.http_json import post_url

ATOL = 1e-4


@dataclass(frozen=True)
class Expected:
    """One (context, continuation) pair and what transformers says lm-eval should report."""

    context: str
    continuation: str
    logprob: float
    is_greedy: bool
    # The model's greedy token right after the continuation is EOS: the generated token lm-eval
    # drops from the echoed arrays ends the completion.
    ends: bool = False


class Reference:
    """A model in transformers, scoring token IDs in float64 log_softmax."""

    def __init__(self, model_dir: Path) -> None:
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32
        ).eval()
        config = transformers.GenerationConfig.from_pretrained(model_dir)
        eos = config.eos_token_id
        self.eos_token_ids = frozenset(eos if isinstance(eos, list) else [eos])

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids)

    def split(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """lm-eval's split: the context alone, then the rest of the whole text's encoding
        (an empty context becomes the BOS token; trailing whitespace of the context moves to
        the continuation, as lm-eval's `_encode_pair` moves it)."""
        stripped = context.rstrip()
        context, continuation = stripped, context[len(stripped) :] + continuation
        if not context:
            return [self.tokenizer.bos_token_id], self.encode(continuation)
        context_ids = self.encode(context)
        whole = self.encode(context + continuation)
        if whole[: len(context_ids)] != context_ids:
            raise ValueError(f"{context!r} does not tokenize as a prefix of its continuation")
        return context_ids, whole[len(context_ids) :]

    def log_softmax(self, token_ids: list[int]) -> torch.Tensor:
        """Row i: float64 log_softmax of the logits that predict token i + 1."""
        with torch.no_grad():
            logits = self.model(torch.tensor([token_ids])).logits[0]
        return torch.log_softmax(logits.double(), dim=-1)

    def score(self, context: str, continuation: str) -> Expected:
        context_ids, continuation_ids = self.split(context, continuation)
        token_ids = context_ids + continuation_ids
        # The server re-tokenizes string prompts: they must come back as the same IDs.
        if self.encode(self.decode(token_ids)) != token_ids:
            raise ValueError(f"{context + continuation!r} does not survive decode/encode")
        logprobs = self.log_softmax(token_ids)
        rows = range(len(context_ids) - 1, len(token_ids) - 1)
        chosen = [logprobs[row, token_ids[row + 1]].item() for row in rows]
        greedy = all(int(logprobs[row].argmax()) == token_ids[row + 1] for row in rows)
        ends = int(logprobs[-1].argmax()) in self.eos_token_ids
        return Expected(context, continuation, sum(chosen), greedy, ends)

    def greedy(self, token_ids: list[int], limit: int, *, min_tokens: int = 0) -> list[int]:
        """Greedy tokens after `token_ids`, at most `limit`, the first EOS included."""
        with torch.no_grad():
            generated = self.model.generate(
                torch.tensor([token_ids]),
                max_new_tokens=limit,
                min_new_tokens=min_tokens,
                do_sample=False,
                eos_token_id=sorted(self.eos_token_ids),
                pad_token_id=min(self.eos_token_ids),
            )[0, len(token_ids) :].tolist()
        return generated

    def ending_cases(self, contexts: Iterable[str], limit: int) -> tuple[Expected, Expected]:
        """A one-token and a multi-token continuation after which the greedy token is EOS.

        Each context is decoded greedily until EOS; a run of k >= 1 tokens before EOS gives
        the one-token case (context plus the first k - 1 tokens, then the k-th), a run of
        k >= 2 the multi-token case. Only splits that survive decode/encode count.
        """
        one = many = None
        for context in contexts:
            context_ids = self.encode(context)
            generated = self.greedy(context_ids, limit)
            if not generated or generated[-1] not in self.eos_token_ids or len(generated) < 2:
                continue
            run = generated[:-1]
            for head, tail in ((run[:-1], run[-1:]), ([], run)):
                if len(tail) > 1 and many is not None or len(tail) == 1 and one is not None:
                    continue
                case = self._ending_case(context_ids, head, tail)
                if case is None:
                    continue
                if len(tail) == 1:
                    one = case
                else:
                    many = case
            if one is not None and many is not None:
                return one, many
        raise ValueError(f"no context ends greedily in one and in several tokens: {one}, {many}")

    def _ending_case(self, context_ids: list[int], head: list[int], tail: list[int]):
        context = self.decode(context_ids + head)
        continuation = self.decode(context_ids + head + tail)[len(context) :]
        try:
            case = self.score(context, continuation)
        except ValueError:
            return None
        return case if case.ends and case.is_greedy else None


def local_completions(
    base_url: str, served_name: str, tokenizer_dir: Path, max_length: int, **model_args: object
) -> LocalCompletionsAPI:
    return LocalCompletionsAPI(
        base_url=f"{base_url}/v1/completions",
        model=served_name,
        tokenizer=str(tokenizer_dir),
        tokenizer_backend="huggingface",
        max_length=max_length,
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


def scoring_payload(base_url: str, served_name: str, prompt: list[int]) -> dict:
    """The body lm-eval's local-completions sends to score a prompt, answered by the server."""
    body = {
        "model": served_name,
        "prompt": prompt,
        "temperature": 0,
        "max_tokens": 1,
        "logprobs": 1,
        "seed": 1234,
        "echo": True,
    }
    return post_url(base_url, "/v1/completions", body)


def assert_loglikelihoods(results: list[tuple[float, bool]], expected: list[Expected]) -> None:
    assert len(results) == len(expected)
    for case, (logprob, is_greedy) in zip(expected, results, strict=True):
        label = f"{case.context!r} + {case.continuation!r}"
        assert abs(logprob - case.logprob) <= ATOL, (label, logprob, case.logprob)
        assert is_greedy is case.is_greedy, label
