"""A checkpoint stored in bfloat16 loads in the dtype `--dtype` asks for, not the one stored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from adapters.gpu.factory import RunnerSettings
from adapters.gpu.loading.weights import load_model
from adapters.gpu.model.decoder import DecoderModel
from adapters.gpu.model.forward_batch import ForwardBatch, SequenceChunk
from adapters.gpu.model.kv_cache import PagedKVCache
from tests.support.tiny_models import build_tiny_llama

pytestmark = pytest.mark.model

CPU = torch.device("cpu")
BLOCK_SIZE = 4
PROMPT = (5, 17, 3, 250, 42, 9, 101, 7, 64, 33, 2, 190)


@pytest.fixture(scope="module")
def bf16_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny llama with every tensor stored as bfloat16, as most published checkpoints."""
    directory = build_tiny_llama(tmp_path_factory.mktemp("bf16") / "model", vocab_size=300)
    weights = directory / "model.safetensors"
    stored = {name: tensor.to(torch.bfloat16) for name, tensor in load_file(weights).items()}
    save_file(stored, weights, metadata={"format": "pt"})
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["torch_dtype"] = config["dtype"] = "bfloat16"
    config_path.write_text(json.dumps(config), encoding="utf-8")
    return directory


def _loaded(model_dir: Path, flag: str) -> DecoderModel:
    """The model as `--dtype flag --device cpu` loads it."""
    dtype = RunnerSettings(device="cpu", dtype=flag).resolve_dtype(CPU)
    return load_model(model_dir, dtype=dtype, device=CPU)


def _logits(model: DecoderModel) -> torch.Tensor:
    blocks = tuple(range(-(-len(PROMPT) // BLOCK_SIZE)))
    cache = PagedKVCache.allocate(model.config, len(blocks), BLOCK_SIZE, model.dtype, CPU)
    batch = ForwardBatch.build([SequenceChunk(PROMPT, 0, blocks)], BLOCK_SIZE, CPU)
    return model.compute_logits(model(batch, cache))


@pytest.mark.parametrize(
    ("flag", "dtype"),
    [("float32", torch.float32), ("bfloat16", torch.bfloat16), ("auto", torch.float32)],
)
def test_every_weight_takes_the_flags_dtype_and_keeps_the_stored_values(
    bf16_dir: Path, flag: str, dtype: torch.dtype
) -> None:
    model = _loaded(bf16_dir, flag)
    assert {parameter.dtype for parameter in model.parameters()} == {dtype}
    stored = load_file(bf16_dir / "model.safetensors")
    # bfloat16 -> float32 is exact, so either dtype holds exactly the stored values.
    assert torch.equal(model.embed_weight.float(), stored["model.embed_tokens.weight"].float())
    down = model.layers[1].down_weight  # type: ignore[union-attr]
    assert torch.equal(down.float(), stored["model.layers.1.mlp.down_proj.weight"].float())


def test_a_float32_load_of_a_bf16_checkpoint_matches_transformers_float32(
    bf16_dir: Path,
) -> None:
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(bf16_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        expected = reference(torch.tensor([PROMPT])).logits[0]
    ours = _logits(_loaded(bf16_dir, "float32"))
    assert (ours - expected).abs().max().item() <= 1e-4


def test_a_bfloat16_load_matches_transformers_bfloat16_not_float32(bf16_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(bf16_dir, dtype=torch.bfloat16).eval()
    with torch.inference_mode():
        expected = reference(torch.tensor([PROMPT])).logits[0].float()
    rounded = _logits(_loaded(bf16_dir, "bfloat16"))
    exact = _logits(_loaded(bf16_dir, "float32"))
    # Activations round to bfloat16 at every layer, as in transformers' bfloat16 run (equal to
    # it on this CPU); that rounding moves the logits well beyond the bound from float32's.
    assert (rounded - expected).abs().max().item() <= 1e-2
    assert (rounded - exact).abs().max().item() > 1e-2
