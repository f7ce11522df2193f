"""The checks every dense family's tests run: our decoder and engine against transformers."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from adapters.gpu.loading.default_model import resolve_model_dir
from adapters.gpu.loading.weights import load_model
from adapters.gpu.model.decoder import DecoderLayer, DecoderModel
from adapters.gpu.model.forward_batch import ForwardBatch, SequenceChunk
from adapters.gpu.model.kv_cache import PagedKVCache
from adapters.tokenizer.hf import HfTokenizer
from domain.contract.capabilities import LogprobCapability, scored_capacities
from domain.emission.outputs import ChoiceDelta, PromptScores
from domain.logprobs.rules import LogprobAsk
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams
from tests.support.draining import drain
from tests.support.engines import build_engine
from tests.support.gguf_files import write_gguf
from tests.support.gguf_vocab import GgufVocabulary
from tests.support.tiny_models import build_tiny_gemma3, build_tiny_phi3, build_tiny_qwen3
from tests.support.tokenizers import build_byte_level_bpe

VOCAB = 320
BLOCK_SIZE = 4
NUM_BLOCKS = 48
FLOAT32_ATOL = 1e-4
# bfloat16 keeps 8 significant bits: two implementations that round in other places differ by
# a few units of the last place of logits of magnitude ~5.
BFLOAT16_ATOL = 0.25
# Engine logprobs in bfloat16 against float64 log_softmax of transformers' bfloat16 logits:
# measured at most 0.032 over the seven families' decisive checkpoints (2026-12-02).
BFLOAT16_LOGPROB_ATOL = 0.1
CPU = torch.device("cpu")


@dataclass(frozen=True)
class Family:
    """A dense family as the family tests build it: a tiny random checkpoint of VOCAB tokens
    with a byte-level BPE tokenizer, and the names transformers and GGUF give it."""

    name: str  # the test ID, and the GGUF architecture name
    architecture: str  # config.json's architectures[0]
    build: Callable[..., Path]  # a tests.support.tiny_models builder
    seed: int
    options: Mapping[str, object] = field(default_factory=dict)  # more builder arguments
    # A decisive head is its own matrix; families that tie it by default untie it then.
    ties_by_default: bool = False

    def checkpoint(self, directory: Path, dtype: torch.dtype, decisive: bool = False) -> Path:
        untied = {"tie_word_embeddings": False} if decisive and self.ties_by_default else {}
        settings = {**self.options, **untied}
        self.build(
            directory, vocab_size=VOCAB, seed=self.seed, dtype=dtype, decisive=decisive, **settings
        )
        build_byte_level_bpe(directory, vocab_size=VOCAB)
        return directory


FAMILIES = {
    family.name: family
    for family in (
        Family("qwen3", "Qwen3ForCausalLM", build_tiny_qwen3, seed=4),
        Family("phi3", "Phi3ForCausalLM", build_tiny_phi3, seed=5, options={"sliding_window": 8}),
        Family("gemma3", "Gemma3ForCausalLM", build_tiny_gemma3, seed=4, ties_by_default=True),
    )
}


def random_tokens(count: int, seed: int) -> list[int]:
    generator = random.Random(seed)
    return [generator.randrange(VOCAB) for _ in range(count)]


# The prompt every family test feeds a FAMILIES checkpoint.
FAMILY_PROMPT = random_tokens(24, seed=3)


def reference_model(directory: Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).eval()


def reference_logits(reference: torch.nn.Module, tokens: Sequence[int]) -> torch.Tensor:
    """transformers' logits [len, vocab] of one whole sequence, as float32."""
    with torch.no_grad():
        return reference(torch.tensor([list(tokens)])).logits[0].float()


def new_cache(model: DecoderModel) -> PagedKVCache:
    return PagedKVCache.allocate(model.config, NUM_BLOCKS, BLOCK_SIZE, model.dtype, CPU)


def run(model: DecoderModel, chunks: Sequence[SequenceChunk], cache: PagedKVCache) -> torch.Tensor:
    batch = ForwardBatch.build(chunks, BLOCK_SIZE, CPU)
    return model.compute_logits(model(batch, cache))


def blocks_for(positions: int, seed: int) -> tuple[int, ...]:
    """Scrambled block IDs for a sequence of `positions`, so tables are not contiguous."""
    ids = list(range(NUM_BLOCKS))
    random.Random(seed).shuffle(ids)
    return tuple(ids[: -(-positions // BLOCK_SIZE)])


def chunked_logits(
    model: DecoderModel,
    tokens: Sequence[int],
    sizes: Sequence[int],
    blocks: tuple[int, ...] | None = None,
) -> torch.Tensor:
    """Logits of `tokens` fed in chunks of `sizes` (then one token at a time) over one cache,
    in `blocks` (by default scrambled ones, `blocks_for`)."""
    if blocks is None:
        blocks = blocks_for(len(tokens), seed=len(sizes))
    cache = new_cache(model)
    rows, start = [], 0
    for size in [*sizes, *([1] * len(tokens))]:
        if start >= len(tokens):
            break
        chunk = SequenceChunk(tuple(tokens[start : start + size]), start, blocks)
        rows.append(run(model, [chunk], cache))
        start += size
    return torch.cat(rows)


def greedy_over_cache(model: DecoderModel, prompt: Sequence[int], steps: int) -> list[int]:
    """`prompt` then `steps` greedy tokens, decoded one token per forward over the paged cache."""
    return greedy_with_logits(model, prompt, steps)[0]


def greedy_with_logits(
    model: DecoderModel, prompt: Sequence[int], steps: int
) -> tuple[list[int], torch.Tensor]:
    """`greedy_over_cache`'s tokens and the logits rows [steps, vocab] each token came from."""
    tokens = list(prompt)
    blocks = blocks_for(len(prompt) + steps, seed=steps)
    cache = new_cache(model)
    logits = run(model, [SequenceChunk(tuple(tokens), 0, blocks)], cache)
    rows = []
    for _ in range(steps):
        rows.append(logits[-1])
        tokens.append(int(logits[-1].argmax()))
        logits = run(model, [SequenceChunk((tokens[-1],), len(tokens) - 1, blocks)], cache)
    return tokens, torch.stack(rows)


def routing_logs(model: DecoderModel) -> list[list[torch.Tensor]]:
    """Turns on the routing record of every sparse layer; returns the lists it fills, one a
    layer, each forward's experts [rows, k] appended."""
    logs = []
    for module in model.layers:
        experts = module.experts if isinstance(module, DecoderLayer) else None
        if experts is not None:
            experts.routing_log = []
            logs.append(experts.routing_log)
    assert logs, "the model has no sparse layer"
    return logs


def max_difference(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return (actual.float() - expected.float()).abs().max().item()


def assert_greedy_matches(
    tokens: Sequence[int], prompt_length: int, expected: torch.Tensor
) -> None:
    """Each generated token is transformers' argmax at the position before it: greedy decoding
    by transformers (teacher-forced on the same tokens) continues identically."""
    chosen = torch.tensor(tokens[prompt_length:])
    argmax = expected[prompt_length - 1 : len(tokens) - 1].argmax(dim=-1)
    assert torch.equal(chosen, argmax), f"tokens {chosen.tolist()} != {argmax.tolist()}"
    assert len(set(tokens[prompt_length:])) >= 3, "greedy decoding should vary"


def engine_outputs(
    model_dir: Path, prompt: Sequence[int], max_tokens: int, **engine: object
) -> tuple[list[int], list, list]:
    """(generated tokens, chosen-token entries, prompt scores) of one greedy request through
    the real engine with top-5 logprobs and prompt logprobs."""
    capability = LogprobCapability(
        top_k=20, selects_ids=True, scored_capacities=scored_capacities(32)
    )
    settings: dict = {"max_model_len": 128, "capability": capability, **engine}
    built, _, _ = build_engine(model_dir, **settings)
    ask = LogprobAsk(wanted=True, count=5, prompt_logprobs=5)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    request = EngineRequest("r", tuple(prompt), params, logprobs=ask)
    items = drain(built, [request])["r"]
    tokens, entries, scores = [], [], []
    for item in items:
        if isinstance(item, ChoiceDelta):
            tokens += item.token_ids
            entries += [entry.position for entry in item.logprobs]
        elif isinstance(item, PromptScores):
            scores += list(item.scores)
    return tokens, entries, scores


def assert_logprobs_match(
    prompt: Sequence[int],
    tokens: Sequence[int],
    entries: Sequence,
    scores: Sequence,
    expected_logits: torch.Tensor,
    atol: float,
) -> None:
    """Generation logprobs (chosen and top 5) and prompt scores equal float64 log_softmax of
    transformers' logits over prompt + generated tokens."""
    expected = expected_logits.double().log_softmax(dim=-1)
    assert len(entries) == len(tokens)
    for offset, (token, position) in enumerate(zip(tokens, entries, strict=True)):
        row = expected[len(prompt) - 1 + offset]
        assert position.chosen.token_id == token == int(row.argmax())
        assert abs(position.chosen.logprob - row[token].item()) <= atol
        for token_id, logprob in zip(
            position.alternative_ids, position.alternative_logprobs, strict=True
        ):
            assert abs(logprob - row[token_id].item()) <= atol
    assert [score.token_id for score in scores] == list(prompt[1:])
    for index, score in enumerate(scores):
        row = expected[index]
        assert abs(score.logprob - row[score.token_id].item()) <= atol


def assert_bfloat16_engine_logprobs(
    model_dir: Path, reference: torch.nn.Module, prompt: Sequence[int], max_tokens: int = 12
) -> float:
    """Through the real engine in bfloat16, generation logprobs (chosen and top 5) and prompt
    scores equal float64 log_softmax of transformers' bfloat16 logits within bfloat16 rounding
    (BFLOAT16_LOGPROB_ATOL); returns the largest difference seen."""
    tokens, entries, scores = engine_outputs(model_dir, prompt, max_tokens, dtype="bfloat16")
    logits = reference_logits(reference, [*prompt, *tokens])
    expected = logits.double().log_softmax(dim=-1)
    gaps = [
        abs(p.chosen.logprob - expected[len(prompt) - 1 + i][p.chosen.token_id].item())
        for i, p in enumerate(entries)
    ]
    gaps += [
        abs(score.logprob - expected[i][score.token_id].item()) for i, score in enumerate(scores)
    ]
    largest = max(gaps)
    print(f"bfloat16 engine logprobs: largest difference {largest:.4f}")
    assert_logprobs_match(prompt, tokens, entries, scores, logits, BFLOAT16_LOGPROB_ATOL)
    return largest


def transformers_greedy(
    reference: torch.nn.Module, prompt: Sequence[int], steps: int
) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy decoding: each token the argmax of one full forward over the
    sequence so far, and those last rows [steps, vocab] as float32. A full forward per step
    rather than `generate`: its rows are the ones the logits checks compare against, while
    `generate`'s own KV cache rounds bfloat16 differently again."""
    tokens = list(prompt)
    rows = []
    with torch.no_grad():
        for _ in range(steps):
            row = reference(torch.tensor([tokens])).logits[0, -1].float()
            rows.append(row)
            tokens.append(int(row.argmax()))
    return tokens, torch.stack(rows)


def assert_bfloat16_greedy_matches(
    ours: DecoderModel,
    reference: torch.nn.Module,
    prompt: Sequence[int],
    steps: int = 64,
    rerouted: Callable[[list[int], torch.Tensor], set[int]] | None = None,
) -> list[int]:
    """Our bfloat16 greedy decoding over the paged cache equals transformers' bfloat16 greedy
    token for token, and proves something: at every step transformers' top logit leads its
    runner-up by more than twice the largest difference between our rows and its rows, so no
    near-tie decided the agreement. Returns the prompt and the greedy tokens.

    `rerouted` (mixture-of-experts models), given the greedy tokens and transformers' rows,
    names the steps whose rows a router near-tie moved (bfloat16 rounding picked other experts
    than float32 picks, in our model or in transformers'); those steps must still agree on the
    token but are left out of the lead and rounding bounds, since another expert moves a row
    by units, not by rounding."""
    tokens, rows = greedy_with_logits(ours, prompt, steps)
    expected, expected_rows = transformers_greedy(reference, prompt, steps)
    assert tokens == expected, f"{tokens[len(prompt) :]} != {expected[len(prompt) :]}"
    assert len(set(tokens[len(prompt) :])) >= 8, "greedy decoding should vary"
    moved = rerouted(tokens, expected_rows) if rerouted is not None else set()
    kept = [step for step in range(steps) if step not in moved]
    noise = max_difference(rows[kept], expected_rows[kept])
    top2 = expected_rows[kept].topk(2, dim=-1).values
    lead = (top2[:, 0] - top2[:, 1]).min().item()
    numbers = (
        f"smallest lead {lead:.3f}, largest logit difference {noise:.4f}, "
        f"steps a router near-tie moved: {sorted(moved)}"
    )
    print(f"bfloat16 greedy over {steps} tokens: {numbers}")
    assert lead > 2 * noise, numbers
    assert noise <= BFLOAT16_ATOL, numbers
    return tokens


def assert_gguf_serves_as_transformers(
    family: Family,
    model_dir: Path,
    reference: torch.nn.Module,
    workdir: Path,
    vocabulary: GgufVocabulary,
    text: str,
) -> tuple[list[int], HfTokenizer, Any]:
    """`model_dir` written as one GGUF file with `vocabulary` and served through
    resolve_model_dir: our tokenizer encodes `text` as transformers' GGUF tokenizer does, and
    our logits over those tokens equal `reference`'s. Returns the tokens, our tokenizer and
    transformers' (for a family's own checks)."""
    from transformers import AutoTokenizer

    gguf_path = write_gguf(model_dir, workdir / f"tiny-{family.name}.gguf", family.name, vocabulary)

    exported = resolve_model_dir(str(gguf_path), cache_dir=workdir / "cache", progress=False)
    tokenizer = HfTokenizer.from_dir(exported)
    prompt = tokenizer.encode(text)
    ours = load_model(exported, dtype=torch.float32, device="cpu")

    theirs = AutoTokenizer.from_pretrained(workdir, gguf_file=gguf_path.name)
    assert prompt == theirs.encode(text)
    logits = chunked_logits(ours, prompt, [len(prompt)])
    assert max_difference(logits, reference_logits(reference, prompt)) <= FLOAT32_ATOL
    return prompt, tokenizer, theirs
