"""Loading safetensors checkpoints, and the inputs a forward refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from adapters.gpu.loading.weights import MissingTensorError, check_checkpoint, load_model
from adapters.gpu.model.forward_batch import ForwardBatch, SequenceChunk
from adapters.gpu.model.kv_cache import PagedKVCache
from tests.support.tiny_models import build_tiny_llama, build_tiny_qwen2

VOCAB_SIZE = 300
BLOCK_SIZE = 4
CPU = torch.device("cpu")


def prefill_logits(model_dir: Path, tokens: tuple[int, ...]) -> torch.Tensor:
    model = load_model(model_dir, dtype=torch.float32, device=CPU)
    cache = PagedKVCache.allocate(model.config, 4, BLOCK_SIZE, torch.float32, CPU)
    batch = ForwardBatch.build([SequenceChunk(tokens, 0, (2, 0, 3))], BLOCK_SIZE, CPU)
    return model.compute_logits(model(batch, cache))


@pytest.mark.model
def test_sharded_checkpoint_loads_the_same_weights_as_a_single_file(tmp_path: Path) -> None:
    single = build_tiny_qwen2(tmp_path / "single", vocab_size=VOCAB_SIZE)
    sharded = build_tiny_qwen2(tmp_path / "sharded", vocab_size=VOCAB_SIZE, max_shard_size="60KB")
    tokens = (3, 14, 15, 92, 65, 35)

    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("*.safetensors"))) > 1
    assert torch.equal(prefill_logits(single, tokens), prefill_logits(sharded, tokens))


@pytest.mark.model
def test_missing_tensor_is_named_in_the_error(tmp_path: Path) -> None:
    model_dir = build_tiny_llama(tmp_path, vocab_size=VOCAB_SIZE)
    tensors = load_file(model_dir / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, model_dir / "model.safetensors")

    with pytest.raises(MissingTensorError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        load_model(model_dir, dtype=torch.float32, device=CPU)


@pytest.mark.model
def test_untied_checkpoint_without_lm_head_is_refused(tmp_path: Path) -> None:
    model_dir = build_tiny_llama(tmp_path, vocab_size=VOCAB_SIZE, tie_word_embeddings=False)
    tensors = load_file(model_dir / "model.safetensors")
    del tensors["lm_head.weight"]
    save_file(tensors, model_dir / "model.safetensors")

    with pytest.raises(MissingTensorError, match="lm_head.weight"):
        load_model(model_dir, dtype=torch.float32, device=CPU)


@pytest.mark.model
def test_tied_model_shares_one_tensor_for_embedding_and_lm_head(tmp_path: Path) -> None:
    model_dir = build_tiny_llama(tmp_path, vocab_size=VOCAB_SIZE, tie_word_embeddings=True)

    model = load_model(model_dir, dtype=torch.float32, device=CPU)

    assert model.lm_head_weight.data_ptr() == model.embed_weight.data_ptr()


@pytest.mark.model
def test_weights_are_cast_to_the_requested_dtype(tmp_path: Path) -> None:
    model_dir = build_tiny_llama(tmp_path, vocab_size=VOCAB_SIZE)

    model = load_model(model_dir, dtype=torch.bfloat16, device=CPU)

    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    cache = PagedKVCache.allocate(model.config, 2, BLOCK_SIZE, torch.bfloat16, CPU)
    batch = ForwardBatch.build([SequenceChunk((1, 2, 3), 0, (1,))], BLOCK_SIZE, CPU)
    logits = model.compute_logits(model(batch, cache))
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()


@pytest.mark.model
def test_missing_weights_file_is_reported(tmp_path: Path) -> None:
    model_dir = build_tiny_llama(tmp_path, vocab_size=VOCAB_SIZE)
    (model_dir / "model.safetensors").unlink()

    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_model(model_dir, dtype=torch.float32, device=CPU)


@pytest.mark.model
def test_shard_listed_in_the_index_but_absent_is_reported(tmp_path: Path) -> None:
    model_dir = build_tiny_llama(tmp_path, vocab_size=VOCAB_SIZE, max_shard_size="60KB")
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    (model_dir / sorted(set(index["weight_map"].values()))[-1]).unlink()

    with pytest.raises(FileNotFoundError, match="shard"):
        load_model(model_dir, dtype=torch.float32, device=CPU)


def test_block_table_too_short_for_the_chunk_is_refused() -> None:
    chunk = SequenceChunk(tuple(range(5)), 4, (0, 1))

    with pytest.raises(ValueError, match="cannot hold"):
        ForwardBatch.build([chunk], BLOCK_SIZE, CPU)


@pytest.mark.parametrize(
    ("token_ids", "start_position", "block_table"),
    [((), 0, (0,)), ((1,), -1, (0,)), ((-3,), 0, (0,)), ((1,), 0, (-1,))],
)
def test_malformed_chunks_are_refused(
    token_ids: tuple[int, ...], start_position: int, block_table: tuple[int, ...]
) -> None:
    with pytest.raises(ValueError):
        SequenceChunk(token_ids, start_position, block_table)


@pytest.mark.model
def test_forward_refuses_blocks_outside_the_cache_and_tokens_outside_the_vocabulary(
    tmp_path: Path,
) -> None:
    model = load_model(
        build_tiny_llama(tmp_path, vocab_size=VOCAB_SIZE), dtype=torch.float32, device=CPU
    )
    cache = PagedKVCache.allocate(model.config, 2, BLOCK_SIZE, torch.float32, CPU)
    outside_cache = ForwardBatch.build([SequenceChunk((1, 2), 0, (2,))], BLOCK_SIZE, CPU)
    outside_vocab = ForwardBatch.build([SequenceChunk((VOCAB_SIZE,), 0, (1,))], BLOCK_SIZE, CPU)
    other_block_size = ForwardBatch.build([SequenceChunk((1,), 0, (1,))], 2 * BLOCK_SIZE, CPU)

    with pytest.raises(ValueError, match="block 2"):
        model(outside_cache, cache)
    with pytest.raises(ValueError, match="vocabulary"):
        model(outside_vocab, cache)
    with pytest.raises(ValueError, match="block size"):
        model(other_block_size, cache)


@pytest.mark.model
def test_a_load_draws_a_bar_over_the_tensors_only_when_asked_and_the_header_check_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model_dir = build_tiny_llama(tmp_path, vocab_size=VOCAB_SIZE)
    count = len(load_file(model_dir / "model.safetensors"))
    capsys.readouterr()  # transformers' own bar while it saved the checkpoint

    load_model(model_dir, dtype=torch.float32, device=CPU)
    check_checkpoint(model_dir)
    assert capsys.readouterr().err == ""

    load_model(model_dir, dtype=torch.float32, device=CPU, progress=True)
    drawn = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()
    assert drawn[-1].startswith("loading safetensors weights: 100%")
    assert f" {count}/{count} " in drawn[-1]
