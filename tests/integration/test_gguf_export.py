"""Exporting the embedded SmolLM2 GGUF, checked against transformers' own GGUF loading."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from adapters.gpu.loading import default_model, gguf_export
from adapters.gpu.loading.default_model import (
    default_gguf_path,
    default_model_dir,
    exported_model_dir,
    gguf_fingerprint,
    resolve_model_dir,
)
from adapters.gpu.loading.gguf_export import export_gguf, unpermute_rope_rows
from adapters.tokenizer.hf import HfTokenizer

TEXTS = [
    "Hello, world! How are you today?",
    "Numbers 1234567 and 3.14159 split digit by digit.",
    "def square(x):\n    return x ** 2  # comment\n",
    "café naïve 日本語 Привет 🎉🚀",
    "  leading spaces,\ttabs and\n\nblank lines  ",
    "I'm sure you'RE right, they'll see.",
    "<|im_start|>user\nhi<|im_end|>\n",
]
PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helios-cache")


@pytest.fixture(scope="session")
def exported(cache_dir: Path) -> Path:
    """The embedded model, exported once through the cache that later tests expect to reuse."""
    return default_model_dir(cache_dir, progress=False)


@pytest.fixture(scope="session")
def gguf_reference() -> dict[str, Any]:
    """Config, tokenizer and model that transformers builds from the GGUF on its own."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = default_gguf_path()
    with _one_parse_of(path):
        config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        # from_pretrained(gguf_file=...) insists on accelerate; this is the loader it would use.
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        loaded = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)
    tensors = loaded["tensors"]
    model.load_state_dict(tensors, strict=False)
    model.tie_weights()
    model.eval()
    return {"config": config, "tokenizer": tokenizer, "model": model, "tensors": tensors}


@contextmanager
def _one_parse_of(path: Path) -> Iterator[None]:
    """transformers parses the GGUF's metadata anew for the config, the tokenizer and the
    weights (4-5 s of CPU each); here its three calls read one parse of the same file."""
    import gguf

    reader = gguf.GGUFReader(path)
    opened = []

    def shared(checkpoint: Any, *args: Any, **kwargs: Any) -> Any:
        if Path(checkpoint) == path and not args and not kwargs:
            opened.append(checkpoint)
            return reader
        return original(checkpoint, *args, **kwargs)

    original = gguf.GGUFReader
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", shared)
        yield
    # All three went through the shared parse, or this helper no longer saves anything.
    assert len(opened) == 3, opened


@pytest.mark.model
@pytest.mark.slow
def test_exported_config_carries_the_gguf_hyperparameters(
    exported: Path, gguf_reference: dict[str, Any]
) -> None:
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["model_type"] == "llama"
    assert config["hidden_size"] == 576
    assert config["num_hidden_layers"] == 30
    assert config["num_attention_heads"] == 9
    assert config["num_key_value_heads"] == 3
    assert config["intermediate_size"] == 1536
    assert config["vocab_size"] == 49152
    assert config["max_position_embeddings"] == 8192
    assert config["rope_theta"] == 100000.0
    assert config["rms_norm_eps"] == 1e-05
    assert config["tie_word_embeddings"] is True
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)
    reference = gguf_reference["config"]
    for key in ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size", "head_dim"):
        assert config[key] == getattr(reference, key)
    generation = json.loads((exported / "generation_config.json").read_text())
    assert (generation["bos_token_id"], generation["eos_token_id"]) == (1, 2)
    tokenizer_config = json.loads((exported / "tokenizer_config.json").read_text())
    assert tokenizer_config["add_bos_token"] is False
    assert tokenizer_config["eos_token"] == "<|im_end|>"
    assert tokenizer_config["chat_template"] == gguf_reference["tokenizer"].chat_template


@pytest.mark.slow
def test_exported_weights_are_float32_under_hf_names_without_lm_head(exported: Path) -> None:
    from safetensors import safe_open

    with safe_open(str(exported / "model.safetensors"), framework="numpy") as weights:
        names = set(weights.keys())
        q_proj = weights.get_tensor("model.layers.0.self_attn.q_proj.weight")
        k_proj = weights.get_tensor("model.layers.0.self_attn.k_proj.weight")
        embed = weights.get_tensor("model.embed_tokens.weight")
    assert len(names) == 2 + 30 * 9
    assert "lm_head.weight" not in names
    assert {"model.norm.weight", "model.layers.29.mlp.down_proj.weight"} <= names
    assert (q_proj.dtype, q_proj.shape, k_proj.shape) == (np.float32, (576, 576), (192, 576))
    assert embed.shape == (49152, 576)


@pytest.mark.model
@pytest.mark.slow
def test_exported_weights_equal_transformers_gguf_conversion(
    exported: Path, gguf_reference: dict[str, Any]
) -> None:
    from safetensors import safe_open

    reference = gguf_reference["tensors"]
    with safe_open(str(exported / "model.safetensors"), framework="numpy") as weights:
        names = weights.keys()
        assert set(names) == set(reference)
        for name in names:
            np.testing.assert_array_equal(weights.get_tensor(name), reference[name].numpy())


@pytest.mark.model
@pytest.mark.slow
def test_exported_model_logits_match_transformers_gguf_loading(
    exported: Path, gguf_reference: dict[str, Any]
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    token_ids = gguf_reference["tokenizer"](PROMPT, return_tensors="pt").input_ids
    model = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32).eval()
    with torch.no_grad():
        ours = model(token_ids).logits
        expected = gguf_reference["model"](token_ids).logits
    assert ours.shape == (1, token_ids.shape[1], 49152)
    assert torch.allclose(ours, expected, atol=1e-4, rtol=0)


@pytest.mark.model
@pytest.mark.slow
def test_exported_tokenizer_encodes_like_transformers_gguf_tokenizer(
    exported: Path, gguf_reference: dict[str, Any]
) -> None:
    from transformers import PreTrainedTokenizerFast

    ours = HfTokenizer.from_dir(exported)
    fast = PreTrainedTokenizerFast.from_pretrained(exported)
    reference = gguf_reference["tokenizer"]
    for text in TEXTS:
        expected = reference.encode(text)
        assert ours.encode(text) == expected
        assert fast.encode(text) == expected
        assert ours.decode(expected, skip_special_tokens=False) == text


@pytest.mark.slow
def test_exported_tokenizer_reports_smollm_special_tokens_and_bytes(exported: Path) -> None:
    ours = HfTokenizer.from_dir(exported)
    assert ours.vocab_size == 49152
    assert ours.bos_token_id == 1
    assert ours.eos_token_ids == frozenset({2})
    assert ours.special_token_ids == frozenset(range(17))
    assert ours.token_bytes(2) == b"<|im_end|>"
    assert ours.strips_leading_space is False
    for text in TEXTS:
        joined = b"".join(ours.token_bytes(t) for t in ours.encode(text, add_special_tokens=False))
        assert joined == text.encode("utf-8")


@pytest.mark.model
@pytest.mark.slow
def test_exported_chat_template_renders_like_transformers_gguf_tokenizer(
    exported: Path, gguf_reference: dict[str, Any]
) -> None:
    messages = [{"role": "user", "content": "Hi 🎉"}, {"role": "assistant", "content": "Hello"}]
    expected = gguf_reference["tokenizer"].apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert HfTokenizer.from_dir(exported).apply_chat_template(messages) == expected


@pytest.mark.slow
def test_default_model_dir_returns_the_cached_export_without_exporting_again(
    exported: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(default_model, "export_gguf", _refuse_export)
    assert default_model_dir(cache_dir) == exported
    assert exported.parent == cache_dir
    assert exported.name.startswith("SmolLM2-135M-Instruct.Q4_1-")
    assert sorted(p.name for p in cache_dir.iterdir()) == [exported.name]


@pytest.mark.slow
def test_resolve_model_dir_uses_helios_cache_dir_for_the_default_model(
    exported: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(default_model, "export_gguf", _refuse_export)
    monkeypatch.setenv("HELIOS_CACHE_DIR", str(cache_dir))
    assert resolve_model_dir(None) == exported
    assert resolve_model_dir(str(default_gguf_path())) == exported
    assert resolve_model_dir(str(exported)) == exported


def test_resolve_model_dir_rejects_what_is_not_a_model(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(ValueError, match="does not exist"):
        resolve_model_dir(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="no config.json"):
        resolve_model_dir(str(tmp_path))
    with pytest.raises(ValueError, match="neither"):
        resolve_model_dir(str(tmp_path / "notes.txt"))


class _Interrupted(BaseException):
    """Stands for Ctrl-C: a BaseException, as KeyboardInterrupt is. A real KeyboardInterrupt
    would also reach pytest's own handling (under xdist it ended a worker's session quietly)."""


@pytest.mark.slow
def test_an_interrupted_export_leaves_no_directory_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = gguf_export._dequantize
    calls = []

    def failing(tensor: Any, shape: Any) -> np.ndarray:
        calls.append(tensor.name)
        if len(calls) == 5:
            raise _Interrupted
        return real(tensor, shape)

    monkeypatch.setattr(gguf_export, "_dequantize", failing)
    with pytest.raises(_Interrupted):
        export_gguf(default_gguf_path(), tmp_path / "model", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_export_refuses_an_existing_target(tmp_path: Path) -> None:
    with pytest.raises(FileExistsError):
        export_gguf(default_gguf_path(), tmp_path, progress=False)


def test_a_concurrent_export_that_finished_first_is_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def lose_the_race(gguf_path: Path, out_dir: Path, *, progress: bool) -> Path:
        out_dir.mkdir(parents=True)
        (out_dir / "config.json").write_text("{}")
        raise FileExistsError(out_dir)

    monkeypatch.setattr(default_model, "export_gguf", lose_the_race)
    gguf_path = tmp_path / "tiny.gguf"
    gguf_path.write_bytes(b"GGUF" + bytes(64))
    target = exported_model_dir(gguf_path, tmp_path / "cache")
    assert (target / "config.json").is_file()
    assert target.name.startswith("tiny-")


def test_fingerprint_follows_size_and_both_ends_of_the_file(tmp_path: Path) -> None:
    body = bytes(range(256)) * 12_000
    variants = {
        "same": body,
        "head": b"x" + body[1:],
        "tail": body[:-1] + b"x",
        "longer": body + b"\0",
    }
    prints = {}
    for name, payload in variants.items():
        (tmp_path / name).write_bytes(payload)
        prints[name] = gguf_fingerprint(tmp_path / name)
    (tmp_path / "copy").write_bytes(body)
    assert gguf_fingerprint(tmp_path / "copy") == prints["same"]
    assert len(set(prints.values())) == len(variants)


@pytest.mark.parametrize("heads", [1, 3, 9])
def test_unpermute_rope_rows_inverts_llama_cpp_interleaving(heads: int) -> None:
    head_dim, columns = 8, 5
    hf_order = np.arange(heads * head_dim * columns, dtype=np.float32).reshape(-1, columns)
    # llama.cpp's converter: within each head, rows i and i + head_dim/2 become 2i and 2i + 1.
    interleaved = (
        hf_order.reshape(heads, 2, head_dim // 2, columns).swapaxes(1, 2).reshape(hf_order.shape)
    )
    assert not np.array_equal(interleaved, hf_order)
    np.testing.assert_array_equal(unpermute_rope_rows(interleaved, heads), hf_order)


def _refuse_export(*args: object, **kwargs: object) -> Path:
    raise AssertionError("the cached export should have been reused")
