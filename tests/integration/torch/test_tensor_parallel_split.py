"""How a decoder is cut across ranks: heads, key/value replicas, MLP columns and vocabulary."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from adapters.gpu.distributed.collectives import Collectives
from adapters.gpu.distributed.group import Rendezvous
from adapters.gpu.distributed.split import SplitError, split_model
from adapters.gpu.loading.weights import load_model
from adapters.gpu.model.config import ModelConfig
from adapters.gpu.sampling.philox import philox_uniform
from tests.support.tiny_models import build_tiny_llama

SMOLLM2 = ModelConfig(
    architecture="LlamaForCausalLM",
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
    max_position_embeddings=8192,
    tie_word_embeddings=True,
)


def _spans(config: ModelConfig, world: int, vocab: int) -> list[tuple]:
    return [
        (s.query_heads, s.kv_heads, s.inner, s.vocab) for s in split_model(config, world, vocab)
    ]


def test_smollm2_splits_its_three_kv_heads_two_and_one_over_two_ranks():
    assert _spans(SMOLLM2, 2, 49152) == [
        ((0, 6), (0, 2), (0, 768), (0, 24576)),
        ((6, 9), (2, 3), (768, 1536), (24576, 49152)),
    ]


def test_three_ranks_take_one_kv_head_and_its_three_query_heads_each():
    assert [s[:2] for s in _spans(SMOLLM2, 3, 49152)] == [
        ((0, 3), (0, 1)),
        ((3, 6), (1, 2)),
        ((6, 9), (2, 3)),
    ]


def test_fewer_kv_heads_than_ranks_are_replicated_and_split_their_query_heads():
    one_kv = dataclasses.replace(SMOLLM2, num_attention_heads=8, num_key_value_heads=2)
    assert [s[:2] for s in _spans(one_kv, 4, 49152)] == [
        ((0, 2), (0, 1)),
        ((2, 4), (0, 1)),
        ((4, 6), (1, 2)),
        ((6, 8), (1, 2)),
    ]


def test_a_vocabulary_of_three_tiles_splits_2048_and_452_over_two_ranks():
    assert [s[3] for s in _spans(SMOLLM2, 2, 2500)] == [(0, 2048), (2048, 2500)]
    assert [s[3] for s in _spans(SMOLLM2, 3, 2500)] == [(0, 1024), (1024, 2048), (2048, 2500)]


@pytest.mark.parametrize(
    ("heads", "kv_heads", "world", "message"),
    [
        (9, 3, 4, "cannot be replicated evenly"),
        (8, 2, 3, "cannot be replicated evenly"),
        (4, 4, 5, "4 attention heads cannot be split over 5 ranks"),
    ],
)
def test_impossible_splits_are_refused_with_what_would_work(heads, kv_heads, world, message):
    config = dataclasses.replace(SMOLLM2, num_attention_heads=heads, num_key_value_heads=kv_heads)
    with pytest.raises(SplitError, match=message):
        split_model(config, world, 49152)


class _NoCollectives(Collectives):
    """Loading runs no collective; a split model only needs one to be named."""

    def __init__(self) -> None:
        super().__init__()


@pytest.mark.model
def test_each_rank_loads_exactly_its_slices_of_every_tensor(tmp_path):
    directory = build_tiny_llama(
        tmp_path,
        vocab_size=2500,
        hidden_size=96,
        intermediate_size=160,
        num_attention_heads=6,
        num_key_value_heads=3,
        head_dim=16,
        attention_bias=True,
        mlp_bias=True,
    )
    whole = load_model(directory, dtype=torch.float32, device="cpu")
    splits = split_model(whole.config, 2, 2500)
    ranks = [
        load_model(
            directory, dtype=torch.float32, device="cpu", split=s, collectives=_NoCollectives()
        )
        for s in splits
    ]
    for index, layer in enumerate(whole.layers):
        parts = [rank.layers[index] for rank in ranks]
        # q rows of each rank, then k and v rows: 6 query heads of 16 lanes, 3 kv heads.
        q, k, v = layer.qkv_weight.split([96, 48, 48])
        for part, split in zip(parts, splits, strict=True):
            first, last = split.query_heads
            kv_first, kv_last = split.kv_heads
            expected = torch.cat(
                [
                    q[16 * first : 16 * last],
                    k[16 * kv_first : 16 * kv_last],
                    v[16 * kv_first : 16 * kv_last],
                ]
            )
            assert torch.equal(part.qkv_weight, expected)
        assert torch.equal(torch.cat([p.output_weight for p in parts], dim=1), layer.output_weight)
        assert torch.equal(torch.cat([p.down_weight for p in parts], dim=1), layer.down_weight)
        # The row-parallel biases stay whole: they join once, after the all-reduce.
        assert all(torch.equal(p.output_bias, layer.output_bias) for p in parts)
        assert all(torch.equal(p.down_bias, layer.down_bias) for p in parts)
        gate, up = layer.gate_up_weight.chunk(2)
        for part, split in zip(parts, splits, strict=True):
            first, last = split.inner
            assert torch.equal(part.gate_up_weight, torch.cat([gate[first:last], up[first:last]]))
    assert torch.equal(torch.cat([r.lm_head_weight for r in ranks]), whole.lm_head_weight[:2500])
    assert torch.equal(torch.cat([r.embed_weight for r in ranks]), whole.embed_weight[:2500])


def test_shard_noise_is_the_whole_row_s_noise_at_the_same_token_ids():
    seeds = torch.tensor([3, -7, 2**40], dtype=torch.int64)
    counters = torch.tensor([0, 5, 9], dtype=torch.int64)
    whole = philox_uniform(seeds, counters, 2500, 2)
    for first, width in [(0, 1024), (1024, 1024), (2048, 452), (1, 7), (1027, 5)]:
        shard = philox_uniform(seeds, counters, width, 2, first_column=first)
        assert torch.equal(shard, whole[:, first : first + width])


def test_the_rendezvous_reads_torchrun_s_variables_and_refuses_malformed_ones():
    found = Rendezvous.from_environment(
        {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "WORLD_SIZE": "4", "RANK": "2"}
    )
    assert (found.master_addr, found.master_port, found.world_size, found.rank) == (
        "10.0.0.1",
        29500,
        4,
        2,
    )
    assert found.local_rank == 2
    assert found.for_rank(3, 1).environment()["LOCAL_RANK"] == "1"
    with pytest.raises(ValueError, match="MASTER_PORT"):
        Rendezvous.from_environment(
            {"MASTER_ADDR": "a", "MASTER_PORT": "x", "WORLD_SIZE": "2", "RANK": "1"}
        )
    with pytest.raises(ValueError, match="WORLD_SIZE, RANK"):
        Rendezvous.from_environment({"MASTER_ADDR": "a", "MASTER_PORT": "1"})
    with pytest.raises(ValueError, match="outside a world"):
        Rendezvous.from_environment(
            {"MASTER_ADDR": "a", "MASTER_PORT": "1", "WORLD_SIZE": "2", "RANK": "2"}
        )
