"""Our paged decoder's logits equal transformers' on the same tiny random checkpoints."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import pytest
import torch
import transformers

from adapters.gpu.loading.weights import load_model
from adapters.gpu.model.config import ModelConfig
from adapters.gpu.model.decoder import DecoderModel
from adapters.gpu.model.forward_batch import ForwardBatch, SequenceChunk
from adapters.gpu.model.kv_cache import PagedKVCache
from tests.support.tiny_models import build_tiny_llama, build_tiny_mistral, build_tiny_qwen2

VOCAB_SIZE = 320
BLOCK_SIZE = 4
NUM_BLOCKS = 64
ATOL = 1e-4
DEVICE = torch.device("cpu")
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10_000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
CHECKPOINTS = {
    "llama-untied": lambda d: build_tiny_llama(d, tie_word_embeddings=False, vocab_size=VOCAB_SIZE),
    "llama-tied": lambda d: build_tiny_llama(d, tie_word_embeddings=True, vocab_size=VOCAB_SIZE),
    "qwen2-bias": lambda d: build_tiny_qwen2(d, vocab_size=VOCAB_SIZE, seed=1),
    "llama-llama3-rope": lambda d: build_tiny_llama(
        d, vocab_size=VOCAB_SIZE, seed=2, rope_parameters=dict(LLAMA3_ROPE)
    ),
    "mistral-window-5": lambda d: build_tiny_mistral(
        d, vocab_size=VOCAB_SIZE, seed=3, sliding_window=5
    ),
}


@dataclass
class Pair:
    """Our model and transformers' reference, loaded from one checkpoint directory."""

    ours: DecoderModel
    reference: torch.nn.Module
    _cache: dict[tuple[int, ...], torch.Tensor] = field(default_factory=dict)

    def reference_logits(self, token_ids: Sequence[int]) -> torch.Tensor:
        """transformers' logits [len, vocab] of one whole sequence (row p predicts p + 1)."""
        key = tuple(token_ids)
        if key not in self._cache:
            with torch.no_grad():
                self._cache[key] = self.reference(torch.tensor([key])).logits[0].float()
        return self._cache[key]

    def new_cache(self) -> PagedKVCache:
        return PagedKVCache.allocate(
            self.ours.config, NUM_BLOCKS, BLOCK_SIZE, torch.float32, DEVICE
        )

    def run(self, chunks: Sequence[SequenceChunk], cache: PagedKVCache) -> torch.Tensor:
        """Logits [N, vocab] of every row of one forward over `chunks`."""
        batch = ForwardBatch.build(chunks, BLOCK_SIZE, DEVICE)
        return self.ours.compute_logits(self.ours(batch, cache))


@pytest.fixture(scope="module", params=sorted(CHECKPOINTS))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Pair:
    directory = CHECKPOINTS[request.param](tmp_path_factory.mktemp(request.param))
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32
    ).eval()
    return Pair(load_model(directory, dtype=torch.float32, device=DEVICE), reference)


@pytest.fixture(autouse=True)
def _seeded() -> None:
    torch.manual_seed(0)


def random_tokens(count: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB_SIZE) for _ in range(count)]


def shuffled_blocks(seed: int) -> Iterator[int]:
    """Block IDs in a scrambled order, so block tables are neither sorted nor contiguous."""
    ids = list(range(NUM_BLOCKS))
    random.Random(seed).shuffle(ids)
    return iter(ids)


def take_blocks(pool: Iterator[int], positions: int) -> tuple[int, ...]:
    return tuple(next(pool) for _ in range(-(-positions // BLOCK_SIZE)))


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    difference = (actual - expected).abs().max().item()
    assert difference <= ATOL, f"{what}: max |ours - transformers| = {difference:.3g} > {ATOL}"


@pytest.mark.model
def test_full_prefill_of_one_sequence_matches_transformers(pair: Pair) -> None:
    """Every row of a one-forward prefill equals transformers' logits at that position."""
    tokens = random_tokens(23, seed=10)
    blocks = take_blocks(shuffled_blocks(0), len(tokens))

    logits = pair.run([SequenceChunk(tuple(tokens), 0, blocks)], pair.new_cache())

    assert_close(logits, pair.reference_logits(tokens), "full prefill")


@pytest.mark.model
def test_chunked_prefill_matches_transformers(pair: Pair) -> None:
    """A prompt fed in chunks of 3, 5, 1, 4 and 7 tokens gives the one-shot logits."""
    tokens = random_tokens(20, seed=11)
    blocks = take_blocks(shuffled_blocks(1), len(tokens))
    cache = pair.new_cache()
    rows, start = [], 0

    for size in (3, 5, 1, 4, 7):
        chunk = SequenceChunk(tuple(tokens[start : start + size]), start, blocks)
        rows.append(pair.run([chunk], cache))
        start += size

    assert start == len(tokens)
    assert_close(torch.cat(rows), pair.reference_logits(tokens), "chunked prefill")


@pytest.mark.model
def test_token_by_token_decode_after_prefill_matches_transformers(pair: Pair) -> None:
    """After a 6-token prefill, each single-token forward equals transformers' next row."""
    tokens = random_tokens(19, seed=12)
    blocks = take_blocks(shuffled_blocks(2), len(tokens))
    cache = pair.new_cache()

    rows = [pair.run([SequenceChunk(tuple(tokens[:6]), 0, blocks)], cache)]
    for position in range(6, len(tokens)):
        rows.append(pair.run([SequenceChunk((tokens[position],), position, blocks)], cache))

    assert_close(torch.cat(rows), pair.reference_logits(tokens), "decode")


@pytest.mark.model
def test_greedy_decode_of_the_tiny_model_produces_varied_tokens(pair: Pair) -> None:
    """The builders' wide init makes greedy decoding leave a single repeated token."""
    tokens = random_tokens(4, seed=13)
    blocks = take_blocks(shuffled_blocks(3), 24)
    cache = pair.new_cache()

    logits = pair.run([SequenceChunk(tuple(tokens), 0, blocks)], cache)
    for _ in range(12):
        tokens.append(int(logits[-1].argmax()))
        logits = pair.run([SequenceChunk((tokens[-1],), len(tokens) - 1, blocks)], cache)

    assert len(set(tokens[4:])) >= 3
    assert_close(
        pair.run([SequenceChunk(tuple(tokens), 0, blocks)], pair.new_cache()),
        pair.reference_logits(tokens),
        "greedy continuation",
    )


@dataclass
class Stream:
    """One sequence of the mixed-batch test: its tokens, when it joins, how it is chunked."""

    tokens: list[int]
    prompt_length: int
    joins_at_step: int
    chunk_sizes: tuple[int, ...]
    blocks: tuple[int, ...] = ()
    fed: int = 0
    rows: list[torch.Tensor] = field(default_factory=list)

    def next_chunk(self, step: int) -> SequenceChunk | None:
        if step < self.joins_at_step or self.fed == len(self.tokens):
            return None
        if self.fed < self.prompt_length:
            size = self.chunk_sizes[min(len(self.rows), len(self.chunk_sizes) - 1)]
            size = min(size, self.prompt_length - self.fed)
        else:
            size = 1
        chunk = SequenceChunk(tuple(self.tokens[self.fed : self.fed + size]), self.fed, self.blocks)
        self.fed += size
        return chunk


@pytest.mark.model
def test_mixed_batch_of_prompt_chunks_and_decode_rows_matches_transformers(pair: Pair) -> None:
    """Sequences of different lengths share forwards where some rows are prompt chunks and
    others decode rows; block tables are interleaved and shuffled. Every row matches."""
    streams = [
        Stream(random_tokens(14, seed=20), prompt_length=5, joins_at_step=0, chunk_sizes=(5,)),
        Stream(random_tokens(22, seed=21), prompt_length=13, joins_at_step=0, chunk_sizes=(4, 6)),
        Stream(random_tokens(9, seed=22), prompt_length=2, joins_at_step=1, chunk_sizes=(2,)),
        Stream(random_tokens(17, seed=23), prompt_length=11, joins_at_step=2, chunk_sizes=(3,)),
        Stream(random_tokens(12, seed=24), prompt_length=1, joins_at_step=3, chunk_sizes=(1,)),
    ]
    pool = shuffled_blocks(4)
    for _ in range(max(len(s.tokens) for s in streams)):
        for stream in streams:
            if len(stream.blocks) * BLOCK_SIZE < len(stream.tokens):
                stream.blocks += (next(pool),)
    cache = pair.new_cache()
    saw_mixed = False

    for step in range(40):
        scheduled = [(s, c) for s in streams if (c := s.next_chunk(step)) is not None]
        if not scheduled:
            break
        random.Random(step).shuffle(scheduled)
        sizes = {len(chunk.token_ids) for _, chunk in scheduled}
        saw_mixed |= 1 in sizes and len(sizes) > 1
        logits = pair.run([chunk for _, chunk in scheduled], cache)
        offset = 0
        for stream, chunk in scheduled:
            stream.rows.append(logits[offset : offset + len(chunk.token_ids)])
            offset += len(chunk.token_ids)

    assert saw_mixed
    for index, stream in enumerate(streams):
        assert stream.fed == len(stream.tokens)
        assert_close(
            torch.cat(stream.rows), pair.reference_logits(stream.tokens), f"stream {index}"
        )


def test_last_rows_point_at_each_chunks_final_token() -> None:
    """`last_rows` indexes the rows that get sampled: each chunk's last token."""
    chunks = [
        SequenceChunk((1, 2, 3), 0, (0,)),
        SequenceChunk((4,), 7, (1, 2)),
        SequenceChunk((5, 6), 2, (3,)),
    ]

    batch = ForwardBatch.build(chunks, BLOCK_SIZE, DEVICE)

    assert batch.last_rows.tolist() == [2, 3, 5]
    assert batch.positions.tolist() == [0, 1, 2, 7, 2, 3]
    assert batch.slot_mapping.tolist() == [0, 1, 2, 2 * BLOCK_SIZE + 3, 14, 15]


@pytest.mark.model
def test_blocks_for_budget_counts_whole_blocks_of_every_layer() -> None:
    """A block holds keys and values of every layer: 2 * layers * kv_heads * head_dim
    elements per token; the budget buys only whole blocks."""
    config = ModelConfig(
        architecture="LlamaForCausalLM",
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        rope_theta=10_000.0,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    float32_block = 2 * 3 * 2 * 16 * 4 * BLOCK_SIZE  # 3072 bytes

    assert (
        PagedKVCache.blocks_for_budget(config, 10 * float32_block, BLOCK_SIZE, torch.float32) == 10
    )
    assert (
        PagedKVCache.blocks_for_budget(config, 10 * float32_block - 1, BLOCK_SIZE, torch.float32)
        == 9
    )
    assert (
        PagedKVCache.blocks_for_budget(config, 10 * float32_block, BLOCK_SIZE, torch.bfloat16) == 20
    )
    assert PagedKVCache.blocks_for_budget(config, float32_block - 1, BLOCK_SIZE, torch.float32) == 0
    cache = PagedKVCache.allocate(config, 3, BLOCK_SIZE, torch.float32, DEVICE)
    used = sum(t.numel() * t.element_size() for t in (*cache.keys, *cache.values))
    assert used == 3 * float32_block
