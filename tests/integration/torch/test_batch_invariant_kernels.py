"""Batch-invariant kernels: a row's bits do not depend on the rows, chunks or keys beside it."""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from adapters.cli.runner_args import add_runner_arguments, runner_settings
from adapters.gpu.factory import RunnerSettings, build_executor
from adapters.gpu.loading.weights import load_model
from adapters.gpu.model import invariant, native_gemm
from adapters.gpu.model.decoder import DecoderModel
from adapters.gpu.model.forward_batch import ForwardBatch, SequenceChunk
from adapters.gpu.model.invariant import (
    KEY_BLOCK,
    RowInvarianceError,
    blocked_attention,
    check_row_invariance,
    invariant_linear,
)
from adapters.gpu.model.kv_cache import PagedKVCache
from tests.support.tiny_models import build_tiny_llama, build_tiny_mistral, build_tiny_qwen2

BLOCK_SIZE = 4
NUM_BLOCKS = 128
VOCAB_SIZE = 320
CPU = torch.device("cpu")
CHECKPOINTS = {
    "llama": lambda d: build_tiny_llama(d, vocab_size=VOCAB_SIZE),
    "qwen2-bias": lambda d: build_tiny_qwen2(d, vocab_size=VOCAB_SIZE, seed=1),
    "mistral-window-5": lambda d: build_tiny_mistral(
        d, vocab_size=VOCAB_SIZE, seed=3, sliding_window=5
    ),
}


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request: pytest.FixtureRequest):
    """MKL splits a GEMM's rows between threads, so the thread count picks kernels too."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.fixture(params=["native", "padded"])
def kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The compiled fixed-order kernel, or the padded BLAS GEMM that serves without it."""
    if request.param == "padded":
        monkeypatch.setattr(native_gemm, "library", lambda: None)
    else:
        assert native_gemm.library() is not None, "`make native` builds the library"
    return request.param


def test_a_linear_row_has_the_same_bits_whatever_the_row_count(threads, kernel):
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 64, generator=generator) * 0.1
    bias = torch.randn(96, generator=generator)
    rows = torch.randn(80, 64, generator=generator)
    alone = torch.cat([invariant_linear(rows[i : i + 1], weight, bias) for i in range(80)])

    for count in (*range(1, 20), 33, 64, 80):
        assert torch.equal(invariant_linear(rows[:count], weight, bias), alone[:count]), count


def test_the_start_up_probe_passes_both_kernels_and_catches_an_unpadded_gemm(
    threads, kernel, monkeypatch: pytest.MonkeyPatch
):
    generator = torch.Generator().manual_seed(2)
    weights = [torch.randn(96, 64, generator=generator), torch.randn(320, 64, generator=generator)]
    check_row_invariance(weights)

    monkeypatch.setattr(invariant, "invariant_linear", F.linear)
    with pytest.raises(RowInvarianceError, match=r"\(96, 64\) gives 1 rows"):
        check_row_invariance(weights)


def test_blocked_attention_matches_softmax_attention_and_ignores_keys_past_the_query():
    generator = torch.Generator().manual_seed(1)
    length = KEY_BLOCK + 9
    key_cache = torch.randn(4 * KEY_BLOCK, 2, 16, generator=generator)
    value_cache = torch.randn(4 * KEY_BLOCK, 2, 16, generator=generator)
    queries = torch.randn(1, 2, 3, 16, generator=generator)
    slots = torch.randperm(4 * KEY_BLOCK, generator=generator)[:length][None]
    visible = torch.ones(1, 1, 1, length, dtype=torch.bool)

    out = blocked_attention(queries, key_cache, value_cache, slots, visible, 0.25)

    keys = key_cache[slots[0]].transpose(0, 1)[None]
    values = value_cache[slots[0]].transpose(0, 1)[None]
    expected = F.scaled_dot_product_attention(queries, keys, values, scale=0.25)
    assert torch.allclose(out, expected, atol=1e-6)
    # The same query with three more blocks of hidden keys (other cache rows) behind it.
    wider = torch.cat((slots, torch.randint(0, 4 * KEY_BLOCK, (1, 3 * KEY_BLOCK))), dim=1)
    hidden = torch.cat((visible, torch.zeros(1, 1, 1, 3 * KEY_BLOCK, dtype=torch.bool)), dim=3)
    assert torch.equal(blocked_attention(queries, key_cache, value_cache, wider, hidden, 0.25), out)


@pytest.fixture(scope="module", params=sorted(CHECKPOINTS))
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    directory = CHECKPOINTS[request.param](tmp_path_factory.mktemp(request.param))
    return load_model(directory, dtype=torch.float32, device=CPU, batch_invariant=True)


class Sequences:
    """Runs sequences through one model in chosen chunkings, each over its own blocks."""

    def __init__(self, model: DecoderModel) -> None:
        self.model = model
        self.cache = PagedKVCache.allocate(model.config, NUM_BLOCKS, BLOCK_SIZE, torch.float32, CPU)

    def logits(self, prompts: Sequence[tuple[int, ...]], cuts: Sequence[Sequence[int]]):
        """Per prompt, the logits of its every position [len, V] when prompt i is fed in the
        chunk lengths cuts[i], all prompts' k-th chunks sharing the k-th forward."""
        tables = []
        for index, prompt in enumerate(prompts):
            first = index * 24
            tables.append(tuple(range(first, first + -(-len(prompt) // BLOCK_SIZE))))
        rows: list[list[torch.Tensor]] = [[] for _ in prompts]
        starts = [0] * len(prompts)
        for step in range(max(len(c) for c in cuts)):
            chunks, owners = [], []
            for index, prompt in enumerate(prompts):
                if step >= len(cuts[index]):
                    continue
                stop = starts[index] + cuts[index][step]
                fed = prompt[starts[index] : stop]
                chunks.append(SequenceChunk(fed, starts[index], tables[index]))
                owners.append(index)
                starts[index] = stop
            batch = ForwardBatch.build(chunks, BLOCK_SIZE, CPU)
            logits = self.model.compute_logits(self.model(batch, self.cache))
            first = 0
            for owner, chunk in zip(owners, chunks, strict=True):
                rows[owner].append(logits[first : first + len(chunk.token_ids)])
                first += len(chunk.token_ids)
        return [torch.cat(r) for r in rows]


def cut(length: int, size: int) -> list[int]:
    return [min(size, length - start) for start in range(0, length, size)]


@pytest.mark.model
def test_a_sequence_has_the_same_logits_alone_chunked_decoded_or_batched(model, threads):
    generator = random.Random(7)
    prompts = [
        tuple(generator.randrange(VOCAB_SIZE) for _ in range(length))
        for length in (70, 9, 33, 1, 66)
    ]
    sequences = Sequences(model)
    alone = [sequences.logits([p], [[len(p)]])[0] for p in prompts]

    batched = sequences.logits(prompts, [[len(p)] for p in prompts])
    decoded = sequences.logits(prompts, [[1] * len(p) for p in prompts])
    chunked = sequences.logits(prompts, [cut(len(p), 5) for p in prompts])
    mixed = sequences.logits(prompts, [cut(len(p), 1 + 3 * i) for i, p in enumerate(prompts)])

    for index, expected in enumerate(alone):
        for name, found in (("batched", batched), ("decoded", decoded), ("chunked", chunked)):
            assert torch.equal(found[index], expected), (name, index)
        assert torch.equal(mixed[index], expected), ("mixed", index)


def test_the_flag_defaults_off_and_maps_to_the_runner_settings():
    parser = argparse.ArgumentParser()
    add_runner_arguments(parser)

    assert not runner_settings(parser.parse_args([])).batch_invariant
    assert runner_settings(parser.parse_args(["--batch-invariant"])).batch_invariant


def test_the_mode_refuses_tensor_parallelism_and_cuda_before_loading_anything(tmp_path: Path):
    with pytest.raises(ValueError, match="does not support tensor parallelism"):
        RunnerSettings(batch_invariant=True, tensor_parallel_size=2)
    cuda = RunnerSettings(device="cuda", batch_invariant=True)
    with pytest.raises(ValueError, match="runs on the CPU only"):
        build_executor(tmp_path / "absent", cuda, VOCAB_SIZE)
