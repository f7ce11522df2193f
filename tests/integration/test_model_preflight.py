"""The start-up check reads headers only, yet refuses what the loader would refuse, by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from adapters.cli.main import main
from adapters.cli.preflight import PreflightError, check_model, check_models
from adapters.gpu.factory import RunnerSettings
from adapters.gpu.loading.weights import MissingTensorError, ShapeMismatchError, load_model
from tests.support.broken_checkpoints import (
    broken_copy,
    edit_config,
    edit_tensors,
    write_tiny_gguf,
)
from tests.support.tiny_serving import build_tiny_model_dir

pytestmark = pytest.mark.model

_RUNNER = RunnerSettings(device="cpu")


@pytest.fixture(scope="module")
def good_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model_dir(tmp_path_factory.mktemp("preflight") / "good")


def _refusal(model: Path | str, runner: RunnerSettings = _RUNNER) -> str:
    with pytest.raises(PreflightError) as caught:
        check_models(str(model), runner)
    message = str(caught.value)
    assert "\n" not in message
    return message


def _refused_alike(broken: Path, error: type[Exception]) -> str:
    """The start-up check's refusal of `broken`, which the loader raises as `error` word for
    word."""
    message = _refusal(broken)
    with pytest.raises(error) as loading:
        load_model(broken, dtype=torch.float32, device="cpu")
    assert str(loading.value) == message
    return message


def test_a_good_checkpoint_passes_with_the_config_the_loader_reads(good_dir: Path) -> None:
    config = check_models(str(good_dir), _RUNNER)
    assert config == load_model(good_dir, dtype=torch.float32, device="cpu").config


def test_a_missing_tensor_is_named_alike_by_the_check_and_the_loader(
    good_dir: Path, tmp_path: Path
) -> None:
    broken = broken_copy(good_dir, tmp_path / "missing")
    edit_tensors(broken, drop="model.layers.1.mlp.down_proj.weight")
    message = _refused_alike(broken, MissingTensorError)
    assert message == f"checkpoint in {broken} lacks tensor 'model.layers.1.mlp.down_proj.weight'"


def test_a_wrong_shape_names_the_file_the_tensor_and_both_shapes(
    good_dir: Path, tmp_path: Path
) -> None:
    broken = broken_copy(good_dir, tmp_path / "shape")
    edit_tensors(broken, rows_off={"model.layers.0.self_attn.k_proj.weight": 2})
    expected = (
        f"{broken / 'model.safetensors'}: tensor 'model.layers.0.self_attn.k_proj.weight' "
        "has shape (30, 64), expected (32, 64)"
    )
    assert _refused_alike(broken, ShapeMismatchError) == expected


def test_an_unknown_architecture_and_a_garbled_config_name_the_config_file(
    good_dir: Path, tmp_path: Path
) -> None:
    unknown = broken_copy(good_dir, tmp_path / "unknown")
    edit_config(unknown, architectures=["FancyForCausalLM"])
    message = _refusal(unknown)
    assert message.startswith(f"{unknown / 'config.json'}: unsupported model architecture")
    assert "'FancyForCausalLM'" in message and "LlamaForCausalLM" in message
    garbled = broken_copy(good_dir, tmp_path / "garbled")
    (garbled / "config.json").write_text('{"architectures": [', encoding="utf-8")
    assert _refusal(garbled).startswith(f"{garbled / 'config.json'} is not valid JSON")


def test_a_split_that_cannot_exist_and_a_too_long_max_model_len_are_refused(
    good_dir: Path,
) -> None:
    assert "cannot be replicated evenly over 3 ranks" in _refusal(
        good_dir, RunnerSettings(device="cpu", tensor_parallel_size=3)
    )
    assert _refusal(good_dir, RunnerSettings(device="cpu", max_model_len=4096)) == (
        "--max-model-len 4096 exceeds the model's 512 positions (max_position_embeddings)"
    )


def test_a_well_formed_gguf_passes_from_its_tensor_infos(tmp_path: Path) -> None:
    config = check_models(str(write_tiny_gguf(tmp_path / "tiny.gguf")), _RUNNER)
    assert (config.architecture, config.num_hidden_layers, config.hidden_size) == (
        "LlamaForCausalLM",
        2,
        64,
    )


def test_a_gguf_tensor_the_export_cannot_dequantize_is_named_with_its_type(
    tmp_path: Path,
) -> None:
    path = write_tiny_gguf(tmp_path / "q8_1.gguf", q8_1_tensor="blk.1.ffn_down.weight")
    message = _refusal(path)
    assert message.startswith(
        f"{path}: tensor 'blk.1.ffn_down.weight' has quantization type Q8_1, which the export "
        "cannot dequantize (supported: "
    )
    assert "Q4_1" in message


def test_a_gguf_tensor_type_no_reader_knows_is_named_with_its_id(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "unknown.gguf", unknown_type_tensor="blk.0.attn_k.weight")
    assert _refusal(path).startswith(f"{path}: tensor 'blk.0.attn_k.weight' has GGUF type 99")


def test_a_gguf_of_an_unknown_architecture_is_refused(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "fancy.gguf", architecture="fancy")
    assert "architecture 'fancy' is not supported" in _refusal(path)


def test_a_missing_or_unreadable_tokenizer_file_is_refused_naming_it(
    good_dir: Path, tmp_path: Path
) -> None:
    missing = broken_copy(good_dir, tmp_path / "missing")
    (missing / "tokenizer.json").unlink()
    assert _refusal(missing) == f"{missing} has no tokenizer.json"
    garbled = broken_copy(good_dir, tmp_path / "garbled")
    (garbled / "tokenizer.json").write_text('{"model": ', encoding="utf-8")
    assert _refusal(garbled).startswith(f"{garbled / 'tokenizer.json'} is not a readable tokenizer")
    config = broken_copy(good_dir, tmp_path / "config")
    (config / "tokenizer_config.json").write_bytes(b"\xff\xfe not text")
    assert _refusal(config).startswith(f"{config / 'tokenizer_config.json'} is not UTF-8 text")


def test_a_gguf_whose_tokenizer_the_export_cannot_build_is_refused(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "bert.gguf", tokenizer_model="bert")
    assert _refusal(path) == (
        "bert.gguf: tokenizer model 'bert' is not supported (supported: gpt2, llama)"
    )


def test_export_runs_the_same_check_and_writes_nothing_for_a_model_it_refuses(
    good_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = broken_copy(good_dir, tmp_path / "shape")
    edit_tensors(broken, rows_off={"model.layers.0.mlp.up_proj.weight": 1})
    with pytest.raises(PreflightError) as caught:
        check_model(str(broken))
    capsys.readouterr()

    assert main(["export", str(broken), "--output", str(tmp_path / "core")]) == 2
    assert capsys.readouterr().err == f"helios export: error: {caught.value}\n"
    assert not (tmp_path / "core").exists()
