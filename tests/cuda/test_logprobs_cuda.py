"""On CUDA: the compiled Triton logprob reducer against the reference, in graphs and compiled."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

import pytest
import torch
import triton

from adapters.gpu.logprobs import triton_reducer
from adapters.gpu.logprobs.custom_op import logprob_reduce_operator
from adapters.gpu.logprobs.reducer import LogprobReducer, ReductionInputs
from adapters.gpu.logprobs.reference_reducer import ReferenceLogprobReducer
from adapters.gpu.logprobs.triton_reducer import TritonLogprobReducer
from domain.logprobs.values import FULL_POSITION_WORDS, MAX_SELECTED_IDS, NATURAL_TOP_K

# Every test here needs a CUDA device; tests/conftest.py skips them where there is none.
pytestmark = pytest.mark.gpu

DEVICE = "cuda"
VOCAB_SIZES = (49_152, 151_936)  # SmolLM2's and Qwen2's vocabularies
LARGE_VOCAB = 151_936
ROW_COUNTS = (1, 8, 64, 256)
MIXED_ROW_COUNTS = (8, 256)
GRAPH_ROWS = 64
COMPILE_ROWS = 64
LOGIT_DTYPES = (torch.bfloat16, torch.float32)
LOGIT_SCALE = 4.0  # spreads bf16 logits so that the top K hold both ties and distinct values
# Mixed batches' logits are wider than the vocabulary, as a model's padded output is.
PADDED_LANES = 128
PADDING_LOGIT = 1e4
# A requesting slot's role (slot + seed) % 8 of 2 or 4 selects this many IDs; other even roles
# take the natural K.
SELECTED_BY_ROLE = {2: 1, 4: MAX_SELECTED_IDS}
TOKENS = 2  # positions per slot in the frame; each row writes one of them
SENTINEL = 0x5A5A5A5A
STALE_IDS = (10**6, -5)  # past a slot's uploaded prefix; never valid read indices
# A power of two, so that a compiler turning the division into a multiply changes no bit.
TEMPERATURE = 0.5


@dataclass(frozen=True)
class Batch:
    """One step's reducer inputs on one device; row r writes out[slots[r], positions[r]]."""

    logits: torch.Tensor
    slots: torch.Tensor
    positions: torch.Tensor
    chosen: torch.Tensor
    requested: torch.Tensor
    counts: torch.Tensor | None
    token_ids: torch.Tensor | None

    @property
    def words(self) -> int:
        return 2 + 2 * NATURAL_TOP_K if self.counts is None else FULL_POSITION_WORDS

    def arguments(self) -> tuple[torch.Tensor | None, ...]:
        return tuple(getattr(self, field.name) for field in fields(self))

    def to(self, device: str) -> Batch:
        moved = (None if tensor is None else tensor.to(device) for tensor in self.arguments())
        return Batch(*moved)

    def copy_into(self, static: Batch) -> None:
        """Overwrites `static`'s tensors in place, as a captured graph's inputs are refreshed."""
        for source, target in zip(self.arguments(), static.arguments(), strict=True):
            target.copy_(source)

    def written(self) -> torch.Tensor:
        """[capacity, TOKENS, words] on the CPU: True for each word the contract writes."""
        requested = self.requested.cpu()
        counts = None if self.counts is None else self.counts.cpu()
        mask = torch.zeros(requested.shape[0], TOKENS, self.words, dtype=torch.bool)
        for slot, position in zip(self.slots.tolist(), self.positions.tolist(), strict=True):
            if requested[slot] == 0:
                continue
            count = 0 if counts is None else min(int(counts[slot]), MAX_SELECTED_IDS)
            pairs = count if count > 0 else NATURAL_TOP_K
            mask[slot, position, : 2 + 2 * pairs] = True
        return mask


def _generator(seed: int) -> torch.Generator:
    return torch.Generator(device=DEVICE).manual_seed(seed)


def _logits(
    generator: torch.Generator, rows: int, vocab: int, dtype: torch.dtype, padding: int
) -> torch.Tensor:
    real = torch.randn((rows, vocab), generator=generator, device=DEVICE) * LOGIT_SCALE
    pad = torch.full((rows, padding), PADDING_LOGIT, device=DEVICE)
    return torch.cat([real, pad], dim=1).to(dtype)


def _rows(generator: torch.Generator, rows: int, vocab: int) -> tuple[torch.Tensor, ...]:
    """Slots (a permutation, so no two rows share a frame cell), positions and chosen IDs."""
    slots = torch.randperm(rows, generator=generator, device=DEVICE)
    positions = torch.randint(TOKENS, (rows,), generator=generator, device=DEVICE)
    chosen = torch.randint(vocab, (rows,), generator=generator, device=DEVICE)
    return slots, positions, chosen


def natural_batch(rows: int, vocab: int, dtype: torch.dtype, seed: int) -> Batch:
    """Every row requests the natural top K; no slot selects IDs."""
    generator = _generator(seed)
    logits = _logits(generator, rows, vocab, dtype, padding=0)
    slots, positions, chosen = _rows(generator, rows, vocab)
    requested = torch.ones(rows, dtype=torch.int32, device=DEVICE)
    return Batch(logits, slots, positions, chosen, requested, None, None)


def mixed_batch(rows: int, vocab: int, dtype: torch.dtype, seed: int) -> Batch:
    """Half the slots do not request; of the rest, some select 1 or 128 IDs, others natural K.

    The roles rotate with `seed`, so batches of different seeds flip every slot's flags. Some
    chosen and selected IDs fall outside the vocabulary (padded lanes, -1) and must read NaN.
    """
    generator = _generator(seed)
    logits = _logits(generator, rows, vocab, dtype, padding=PADDED_LANES)
    slots, positions, chosen = _rows(generator, rows, vocab)
    chosen[::7] = vocab + 1
    # Flags and IDs are built on the host: one upload instead of a launch per slot.
    host = torch.Generator().manual_seed(seed)
    requested = torch.zeros(rows, dtype=torch.int32)
    counts = torch.zeros(rows, dtype=torch.int32)
    token_ids = torch.tensor(STALE_IDS, dtype=torch.int32).repeat(rows, MAX_SELECTED_IDS // 2)
    for slot in range(rows):
        role = (slot + seed) % 8
        if role % 2:
            continue
        requested[slot] = 1
        selected = SELECTED_BY_ROLE.get(role, 0)
        if selected:
            counts[slot] = selected
            token_ids[slot, :selected] = torch.randint(vocab, (selected,), generator=host)
    many = counts == MAX_SELECTED_IDS
    token_ids[many, 5], token_ids[many, 77] = vocab, -1
    requested, counts, token_ids = (t.to(DEVICE) for t in (requested, counts, token_ids))
    return Batch(logits, slots, positions, chosen, requested, counts, token_ids)


def empty_frame(batch: Batch) -> torch.Tensor:
    capacity = batch.requested.shape[0]
    shape = (capacity, TOKENS, batch.words)
    return torch.full(shape, SENTINEL, dtype=torch.int32, device=batch.logits.device)


def reduce_into_frame(reducer: LogprobReducer, batch: Batch) -> torch.Tensor:
    out = empty_frame(batch)
    reducer.reduce(ReductionInputs(*batch.arguments(), out))
    return out


def assert_same_words(expected: torch.Tensor, got: torch.Tensor) -> None:
    expected, got = expected.cpu(), got.cpu()
    if not torch.equal(expected, got):
        differing = (expected != got).nonzero()
        first = differing[:4].tolist()
        raise AssertionError(f"{len(differing)} of {expected.numel()} words differ, first {first}")


def assert_untouched(batch: Batch, out: torch.Tensor) -> None:
    """Every word the contract does not write still holds the sentinel."""
    kept = out.cpu()[~batch.written()]
    assert torch.equal(kept, torch.full_like(kept, SENTINEL)), "a word outside the payload changed"


def compiled_kernel_count() -> int:
    """How many kernel binaries the reducer module's Triton functions hold, all devices."""
    jitted = [
        value
        for value in vars(triton_reducer).values()
        if isinstance(value, triton.runtime.jit.JITFunction)
    ]
    if not jitted or not all(hasattr(function, "device_caches") for function in jitted):
        pytest.skip("this Triton keeps no per-device kernel caches to count compilations by")
    # Each device's entry is (kernels by specialization key, key cache, target, backend, binder).
    return sum(len(entry[0]) for function in jitted for entry in function.device_caches.values())


@pytest.fixture(autouse=True)
def _compiled_kernels() -> None:
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.fail("TRITON_INTERPRET=1: these checks are for compiled kernels, unset it")


@pytest.mark.parametrize("dtype", LOGIT_DTYPES, ids=str)
@pytest.mark.parametrize("rows", ROW_COUNTS)
@pytest.mark.parametrize("vocab", VOCAB_SIZES)
def test_natural_top_k_words_equal_the_reference_bit_for_bit_at_real_sizes(
    vocab: int, rows: int, dtype: torch.dtype
) -> None:
    """Every row requesting K=20: the Triton frame is the CUDA reference's, word for word."""
    batch = natural_batch(rows, vocab, dtype, seed=rows)

    expected = reduce_into_frame(ReferenceLogprobReducer(vocab), batch)
    got = reduce_into_frame(TritonLogprobReducer(vocab), batch)

    assert_same_words(expected, got)
    assert_untouched(batch, got)


@pytest.mark.parametrize("dtype", LOGIT_DTYPES, ids=str)
@pytest.mark.parametrize("rows", MIXED_ROW_COUNTS)
@pytest.mark.parametrize("vocab", VOCAB_SIZES)
def test_mixed_requests_equal_the_reference_and_leave_other_words_untouched(
    vocab: int, rows: int, dtype: torch.dtype
) -> None:
    """Non-requesting, natural, 1-ID and 128-ID slots together over padded logits."""
    batch = mixed_batch(rows, vocab, dtype, seed=rows)

    expected = reduce_into_frame(ReferenceLogprobReducer(vocab), batch)
    got = reduce_into_frame(TritonLogprobReducer(vocab), batch)

    assert_same_words(expected, got)
    assert_untouched(batch, got)


@pytest.mark.parametrize("dtype", LOGIT_DTYPES, ids=str)
def test_the_gpu_reducer_writes_the_words_of_the_reference_run_on_the_cpu(
    dtype: torch.dtype,
) -> None:
    """The bits do not depend on the device: the CPU reference is the oracle a CPU server uses."""
    batch = mixed_batch(GRAPH_ROWS, LARGE_VOCAB, dtype, seed=11)

    expected = reduce_into_frame(ReferenceLogprobReducer(LARGE_VOCAB), batch.to("cpu"))
    got = reduce_into_frame(TritonLogprobReducer(LARGE_VOCAB), batch)

    assert_same_words(expected, got)


def test_a_captured_cuda_graph_replays_fresh_inputs_into_the_reference_words() -> None:
    """Capture once after reserve and a warm-up; each replay reads the refreshed static inputs."""
    vocab, rows = LARGE_VOCAB, GRAPH_ROWS
    static = mixed_batch(rows, vocab, torch.bfloat16, seed=0)
    out = empty_frame(static)
    reducer = TritonLogprobReducer(vocab)
    reducer.reserve(rows, DEVICE)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        # Compiles every kernel outside the capture.
        reducer.reduce(ReductionInputs(*static.arguments(), out))
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        reducer.reduce(ReductionInputs(*static.arguments(), out))

    for seed in (1, 2):
        fresh = mixed_batch(rows, vocab, torch.bfloat16, seed)
        fresh.copy_into(static)
        out.fill_(SENTINEL)
        graph.replay()
        torch.cuda.synchronize()

        expected = reduce_into_frame(ReferenceLogprobReducer(vocab), fresh)
        assert_same_words(expected, out)
        assert_untouched(fresh, out)


def test_the_custom_operator_under_torch_compile_writes_the_eager_words() -> None:
    """fullgraph inductor keeps the opaque write and reads the logits before they change."""
    vocab = LARGE_VOCAB
    batch = mixed_batch(COMPILE_ROWS, vocab, torch.bfloat16, seed=5)
    bias = torch.randn(batch.logits.shape[1], generator=_generator(6), device=DEVICE)
    bias = bias.to(batch.logits.dtype)
    operator = logprob_reduce_operator()

    def sample_step(logits, bias, slots, positions, chosen, requested, counts, token_ids, out):
        shifted = logits + bias
        operator(
            shifted, slots, positions, chosen, requested, counts, token_ids, out,
            vocab, NATURAL_TOP_K,
        )  # fmt: skip
        # Changed after the operator read it: the division must not move before the operator.
        return shifted.div_(TEMPERATURE)

    logits, *row_inputs = batch.arguments()
    eager_out, compiled_out = empty_frame(batch), empty_frame(batch)
    eager_scaled = sample_step(logits, bias, *row_inputs, eager_out)
    compiled = torch.compile(sample_step, fullgraph=True)
    compiled_scaled = compiled(logits, bias, *row_inputs, compiled_out)

    assert_untouched(batch, eager_out)
    assert not torch.equal(eager_out, empty_frame(batch)), "the operator wrote nothing"
    assert_same_words(eager_out, compiled_out)
    assert torch.equal(eager_scaled, compiled_scaled)


def test_no_kernel_compiles_after_the_first_call_when_only_the_row_count_changes() -> None:
    """After reserve and one call, other row counts reuse the compiled kernels (no JIT stall)."""
    vocab, dtype = LARGE_VOCAB, torch.bfloat16
    reducer = TritonLogprobReducer(vocab)
    reducer.reserve(max(ROW_COUNTS), DEVICE)
    reduce_into_frame(reducer, natural_batch(8, vocab, dtype, seed=21))
    torch.cuda.synchronize()
    prepared = compiled_kernel_count()

    for rows in ROW_COUNTS:
        reduce_into_frame(reducer, natural_batch(rows, vocab, dtype, seed=22 + rows))
    torch.cuda.synchronize()

    assert prepared > 0, "no compiled kernel was found: the count cannot see compilations"
    assert compiled_kernel_count() == prepared


# -----------------------------------------------------------------------------------------------
# Vocabulary-parallel reducer: one rank of an NCCL world, captured in a graph and under compile.
# -----------------------------------------------------------------------------------------------

import torch.distributed as dist  # noqa: E402

from adapters.gpu.logprobs.custom_op_vp import vocab_parallel_operators  # noqa: E402
from adapters.gpu.logprobs.normalizer import LSE_TILE  # noqa: E402
from adapters.gpu.logprobs.reference_reducer_vp import EXCHANGE_WORDS  # noqa: E402
from adapters.gpu.logprobs.triton_reducer_vp import TritonVocabParallelLogprobReducer  # noqa: E402

# SmolLM2's vocabulary: 48 tiles, within what one rank's exchange 1 carries (Qwen2's is not).
SHARDED_VOCAB = 49_152


@pytest.fixture
def one_rank_world(tmp_path):
    """An NCCL world of one rank from a file rendezvous, torn down after the test.

    NCCL rather than gloo: its collectives are enqueued on the device, so they can be captured.
    """
    if not dist.is_available() or not dist.is_nccl_available():
        pytest.skip("this torch has no NCCL backend")
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group(
        "nccl",
        init_method=f"file://{tmp_path}/rendezvous",
        rank=0,
        world_size=1,
        device_id=torch.device(DEVICE, torch.cuda.current_device()),
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_a_captured_vocab_parallel_reducer_replays_fresh_inputs_into_the_eager_words(
    one_rank_world,
) -> None:
    """Reserve, one eager call (compiles every kernel, starts the communicator), then capture:
    each replay reads the refreshed static inputs, both exchanges included."""
    vocab, rows = SHARDED_VOCAB, GRAPH_ROWS
    static = mixed_batch(rows, vocab, torch.bfloat16, seed=0)
    out = empty_frame(static)
    reducer = TritonVocabParallelLogprobReducer(vocab, NATURAL_TOP_K, rank=0, world_size=1)
    reducer.reserve(rows, DEVICE)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        reducer.reduce(ReductionInputs(*static.arguments(), out))
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        reducer.reduce(ReductionInputs(*static.arguments(), out))

    eager = TritonVocabParallelLogprobReducer(vocab, NATURAL_TOP_K, rank=0, world_size=1)
    for seed in (1, 2):
        fresh = mixed_batch(rows, vocab, torch.bfloat16, seed)
        fresh.copy_into(static)
        out.fill_(SENTINEL)
        graph.replay()
        torch.cuda.synchronize()

        assert_same_words(reduce_into_frame(eager, fresh), out)
        assert_same_words(reduce_into_frame(ReferenceLogprobReducer(vocab), fresh), out)
        assert_untouched(fresh, out)


def test_the_statistics_operator_under_torch_compile_writes_the_eager_words() -> None:
    """fullgraph inductor keeps the opaque writes and reads the logits before they change."""
    vocab, rows = SHARDED_VOCAB, COMPILE_ROWS
    batch = mixed_batch(rows, vocab, torch.bfloat16, seed=7)
    bias = torch.randn(batch.logits.shape[1], generator=_generator(8), device=DEVICE)
    bias = bias.to(batch.logits.dtype)
    statistics = vocab_parallel_operators().statistics

    def shard_step(logits, bias, slots, requested, stats, send):
        shifted = logits + bias
        statistics(shifted, slots, requested, stats, send, vocab)
        # Changed after the operator read it: the division must not move before the operator.
        return shifted.div_(TEMPERATURE)

    def buffers() -> tuple[torch.Tensor, torch.Tensor]:
        tiles = -(-vocab // LSE_TILE)
        stats = torch.zeros(rows, tiles, 2, device=DEVICE)
        return stats, torch.zeros(rows, EXCHANGE_WORDS, dtype=torch.int32, device=DEVICE)

    inputs = (batch.logits, bias, batch.slots, batch.requested)
    eager_stats, eager_send = buffers()
    compiled_stats, compiled_send = buffers()
    eager_scaled = shard_step(*inputs, eager_stats, eager_send)
    compiled = torch.compile(shard_step, fullgraph=True)
    compiled_scaled = compiled(*inputs, compiled_stats, compiled_send)

    assert eager_send.any(), "the operator wrote nothing"
    assert_same_words(eager_send, compiled_send)
    assert_same_words(eager_stats.view(torch.int32), compiled_stats.view(torch.int32))
    assert torch.equal(eager_scaled, compiled_scaled)
