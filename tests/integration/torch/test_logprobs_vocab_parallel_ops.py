"""The vocabulary-parallel Triton launches as torch custom ops: exact, declared, traceable."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    # Without a GPU the kernels run in Triton's interpreter, which must be chosen before import.
    os.environ["TRITON_INTERPRET"] = "1"

from adapters.gpu.distributed.shards import shard_range  # noqa: E402
from adapters.gpu.logprobs.keys import CANDIDATES_PER_TILE  # noqa: E402
from adapters.gpu.logprobs.normalizer import LSE_TILE  # noqa: E402
from adapters.gpu.logprobs.reducer import ReductionInputs  # noqa: E402
from adapters.gpu.logprobs.reference_reducer_vp import (  # noqa: E402
    EXCHANGE_WORDS,
    VocabParallelLogprobReducer,
)
from domain.logprobs.values import NATURAL_TOP_K  # noqa: E402
from tests.integration.torch.test_logprobs_vocab_parallel import (  # noqa: E402
    Scenario,
    _reference,
    _shard,
)
from tests.support.gloo import gloo_rank, record_each, spawn_worlds  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
WORLD = 2
OPERATOR_NAMES = ("statistics", "candidates", "merge")
# Three tiles, the last of 100 lanes: rank 0 holds [0, 2048), rank 1 [2048, 2148).
VOCAB = 2 * LSE_TILE + 100
# Each op's writes, by argument name, as its schema must declare them.
DECLARED_WRITES = {
    "statistics": {"stats", "send"},
    "candidates": {"lse", "keys", "send"},
    "merge": {"out"},
}


def _mixed(dtype: torch.dtype) -> Scenario:
    # Natural rows (chosen IDs on both sides of the shard boundary), a row selecting IDs from
    # both shards, one past the vocabulary, and a slot that does not request.
    generator = torch.Generator().manual_seed(23)
    logits = (torch.randn(4, VOCAB, generator=generator) * 4.0).to(dtype)
    return Scenario(
        vocab=VOCAB,
        logits=logits,
        rows=[(0, 0, 2100), (1, 1, 7), (2, 0, 1024), (3, 1, 2047)],
        requests={0: None, 1: [5, 2100, VOCAB + 3, 1024, 2047, 2048], 3: None},
        capacity=4,
        tokens=2,
    )


def _natural_narrow() -> Scenario:
    # No IDs declared (counts and token_ids are None) and a frame only K pairs wide.
    generator = torch.Generator().manual_seed(29)
    logits = (torch.randn(2, VOCAB, generator=generator) * 2.0).to(torch.bfloat16)
    return Scenario(
        vocab=VOCAB,
        logits=logits,
        rows=[(1, 0, 2147), (0, 0, 0)],
        requests={0: None, 1: None},
        capacity=2,
        full=False,
        top_k=3,
    )


CASES = {"mixed_fp32": lambda: _mixed(torch.float32), "natural_narrow": _natural_narrow}


def _helios_has(name: str) -> bool:
    return hasattr(torch.ops.helios, f"vp_logprob_{name}")


def _worker(rank: int, world: int, directory: str) -> None:
    # Gloo ranks hold CPU tensors, so the kernels run in Triton's interpreter even beside a GPU;
    # it must be chosen before triton is imported.
    os.environ["TRITON_INTERPRET"] = "1"
    from adapters.gpu.logprobs.triton_reducer_vp import TritonVocabParallelLogprobReducer

    with gloo_rank(rank, world, directory, timeout_s=60) as results:
        results["registered_after_import"] = [_helios_has(name) for name in OPERATOR_NAMES]
        prepared = TritonVocabParallelLogprobReducer(VOCAB, NATURAL_TOP_K, rank, world)
        prepared.reserve(4, "cpu")
        results["registered_after_reserve"] = [_helios_has(name) for name in OPERATOR_NAMES]

        def both(name: str) -> dict:
            scenario = CASES[name]()
            produced = {}
            for kind, build in (
                ("torch", VocabParallelLogprobReducer),
                ("triton", TritonVocabParallelLogprobReducer),
            ):
                out, requested, counts, token_ids = scenario.frame()
                shard = _shard(scenario.logits, scenario.vocab, world, rank)
                reducer = build(scenario.vocab, scenario.top_k, rank, world)
                reducer.reduce(
                    ReductionInputs(shard, *scenario.columns(), requested, counts, token_ids, out)
                )
                produced[kind] = out.flatten().tolist()
            return produced

        record_each(results, CASES, both)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict[tuple[int, int], dict]:
    return spawn_worlds(_worker, (WORLD,), tmp_path_factory)


@pytest.mark.slow
def test_the_ops_are_registered_by_preparing_a_reducer_not_by_importing_it(ranks) -> None:
    for rank in range(WORLD):
        assert ranks[WORLD, rank]["registered_after_import"] == [False, False, False], rank
        assert ranks[WORLD, rank]["registered_after_reserve"] == [True, True, True], rank


@pytest.mark.slow
@pytest.mark.parametrize("name", tuple(CASES))
def test_the_reducer_through_the_ops_writes_the_torch_stages_words_on_two_gloo_ranks(
    ranks, name
) -> None:
    expected = _reference(CASES[name]())
    for rank in range(WORLD):
        produced = ranks[WORLD, rank][name]
        assert "error" not in produced, f"rank {rank}:\n{produced['error']}"
        staged = torch.tensor(produced["torch"], dtype=torch.int32).view(expected.shape)
        got = torch.tensor(produced["triton"], dtype=torch.int32).view(expected.shape)
        differing = (got != staged).nonzero().tolist()
        assert not differing, (name, rank, differing[:4])
        assert torch.equal(got, expected), (name, rank)


def _moved(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.to(DEVICE)


def _cloned(arguments: tuple) -> tuple:
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in arguments)


@pytest.fixture(scope="module")
def operators():
    from adapters.gpu.logprobs.custom_op_vp import vocab_parallel_operators

    return vocab_parallel_operators()


@pytest.fixture(scope="module")
def staged(operators) -> dict:
    """Both ranks' stages in one process, stacking the send buffers where the exchanges would.

    Returns each op's arguments per rank as they were just before the call, and each rank's
    frame.
    """
    scenario = _mixed(torch.float32)
    out, requested, counts, token_ids = (_moved(t) for t in scenario.frame())
    slots, positions, chosen = (_moved(t) for t in scenario.columns())
    rows = len(scenario.rows)
    ranges = [shard_range(VOCAB, WORLD, rank) for rank in range(WORLD)]
    tiles = [-(-(stop - start) // LSE_TILE) for start, stop in ranges]
    # The stacked exchange holds `rows` rows per rank, so rank p's words start at p * rows * 256.
    tile_words = [
        peer * rows * EXCHANGE_WORDS + 2 * tile
        for peer, count in enumerate(tiles)
        for tile in range(count)
    ]
    tile_words = torch.tensor(tile_words, dtype=torch.int64, device=DEVICE)
    stops = torch.tensor([stop for _, stop in ranges], dtype=torch.int64, device=DEVICE)
    calls: dict[str, list[tuple]] = {name: [] for name in OPERATOR_NAMES}

    def call(name: str, *arguments) -> None:
        calls[name].append(_cloned(arguments))
        getattr(operators, name)(*arguments)

    shards, spaces = [], []
    for rank, (start, stop) in enumerate(ranges):
        shards.append(_shard(scenario.logits, VOCAB, WORLD, rank).to(DEVICE))
        spaces.append(
            {
                "stats": torch.zeros(rows, tiles[rank], 2, device=DEVICE),
                "keys": torch.zeros(
                    rows, tiles[rank], CANDIDATES_PER_TILE, dtype=torch.int64, device=DEVICE
                ),
                "lse": torch.zeros(rows, device=DEVICE),
                "send": torch.zeros(rows, EXCHANGE_WORDS, dtype=torch.int32, device=DEVICE),
            }
        )
        space = spaces[rank]
        call("statistics", shards[rank], slots, requested, space["stats"], space["send"],
             stop - start)  # fmt: skip
    received = torch.stack([space["send"].clone() for space in spaces])
    for rank, (start, stop) in enumerate(ranges):
        space = spaces[rank]
        call(
            "candidates", shards[rank], slots, chosen, requested, counts, token_ids, received,
            tile_words, space["lse"], space["keys"], space["send"], start, stop - start,
        )  # fmt: skip
    received = torch.stack([space["send"].clone() for space in spaces])
    frames = []
    for space in spaces:
        frame = out.clone()
        call(
            "merge", received, stops, slots, positions, chosen, requested, counts, token_ids,
            space["lse"], frame, VOCAB, NATURAL_TOP_K,
        )  # fmt: skip
        frames.append(frame.cpu())
    return {"calls": calls, "frames": frames, "expected": _reference(scenario)}


def test_the_ops_rank_by_rank_with_stacked_buffers_write_the_reference_words(staged) -> None:
    for rank, frame in enumerate(staged["frames"]):
        differing = (frame != staged["expected"]).nonzero().tolist()
        assert not differing, (rank, differing[:4])


def _schema_writes(name: str) -> set[str]:
    schema = getattr(torch.ops.helios, f"vp_logprob_{name}").default._schema
    return {
        argument.name
        for argument in schema.arguments
        if argument.alias_info is not None and argument.alias_info.is_write
    }


@pytest.mark.parametrize("name", OPERATOR_NAMES)
def test_each_op_changes_exactly_the_buffers_its_schema_declares(operators, staged, name) -> None:
    assert _schema_writes(name) == DECLARED_WRITES[name]
    schema = getattr(torch.ops.helios, f"vp_logprob_{name}").default._schema
    for rank, arguments in enumerate(staged["calls"][name]):
        before = _cloned(arguments)
        after = _cloned(arguments)
        getattr(operators, name)(*after)
        for argument, old, new in zip(schema.arguments, before, after, strict=True):
            if not isinstance(old, torch.Tensor):
                continue
            # Bytes, so that NaN words and -0.0 count as the bits they are.
            changed = not torch.equal(old.view(torch.uint8), new.view(torch.uint8))
            assert changed == (argument.name in DECLARED_WRITES[name]), (name, rank, argument)


@pytest.mark.parametrize("name", OPERATOR_NAMES)
def test_opcheck_accepts_each_ops_schema_fake_registration_and_tracing(
    operators, staged, name
) -> None:
    # Schema (declared mutations, no aliasing), fake tensors, and an AOT trace with dynamic
    # shapes, on the inputs rank 1 saw; no collective runs inside an op.
    arguments = _cloned(staged["calls"][name][1])
    torch.library.opcheck(getattr(operators, name), arguments)


@pytest.mark.parametrize("name", OPERATOR_NAMES)
def test_under_fake_tensors_each_op_returns_nothing_and_launches_nothing(
    operators, staged, name
) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        arguments = tuple(
            mode.from_tensor(a) if isinstance(a, torch.Tensor) else a
            for a in staged["calls"][name][0]
        )
        # A Triton launch could not read a fake tensor's storage: the fake kernel ran instead.
        assert getattr(operators, name)(*arguments) is None
