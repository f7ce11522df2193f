"""`helios serve`, `generate` and `export` refuse a model they cannot load in one line, before
gunicorn, an engine process, a tensor-parallel peer or an export starts; one they can load shows
a bar over its weights as it loads."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import safe_open

from tests.e2e.conftest import REPO_ROOT, free_port, server_environment
from tests.support.broken_checkpoints import (
    broken_copy,
    edit_config,
    edit_tensors,
    write_tiny_gguf,
)
from tests.support.marker_guard import require
from tests.support.tiny_serving import build_tiny_model_dir

pytestmark = [pytest.mark.e2e, pytest.mark.model]

# What a started server prints; none of it may appear when the start is refused.
_STARTED = ("Starting gunicorn", "Booting worker", "Worker failed to boot", "[engine ")


@pytest.fixture(scope="module")
def good_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model_dir(tmp_path_factory.mktemp("refusals") / "good")


def _helios(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Runs `helios ARGS` to its end, its cache kept in `workdir`."""
    require("e2e", "it ran the helios command")
    environment = server_environment(workdir)
    environment["HELIOS_CACHE_DIR"] = str(workdir / "cache")
    return subprocess.run(
        [sys.executable, "-m", "adapters.cli.main", *args],
        cwd=REPO_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _refused(workdir: Path, *args: str) -> str:
    """Runs `helios ARGS` to its end; returns its one line of stderr after checking that it
    failed with nothing else printed and nothing started."""
    finished = _helios(workdir, *args)
    output = finished.stdout + finished.stderr
    assert finished.returncode != 0, output
    assert "Traceback" not in output
    assert not [marker for marker in _STARTED if marker in output], output
    assert finished.stdout == ""
    lines = finished.stderr.splitlines()
    assert len(lines) == 1, output
    return lines[0]


def _serve(workdir: Path, model: Path, *flags: str) -> str:
    port = str(free_port())
    return _refused(workdir, "serve", str(model), "--port", port, "--device", "cpu", *flags)


def test_serve_refuses_an_unknown_architecture_naming_its_config(
    good_dir: Path, tmp_path: Path
) -> None:
    broken = broken_copy(good_dir, tmp_path / "unknown")
    edit_config(broken, architectures=["FancyForCausalLM"])
    line = _serve(tmp_path, broken)
    assert line.startswith(
        f"helios serve: error: {broken / 'config.json'}: unsupported model architecture "
        "'FancyForCausalLM'; supported: "
    )


def test_tensor_parallel_serve_refuses_a_missing_tensor_before_any_peer_starts(
    good_dir: Path, tmp_path: Path
) -> None:
    broken = broken_copy(good_dir, tmp_path / "missing")
    edit_tensors(broken, drop="model.layers.1.mlp.down_proj.weight")
    line = _serve(tmp_path, broken, "--tensor-parallel-size", "2")
    assert line == (
        f"helios serve: error: checkpoint in {broken} lacks tensor "
        "'model.layers.1.mlp.down_proj.weight'"
    )


def test_serve_with_two_api_servers_refuses_a_gguf_it_cannot_dequantize(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "q8_1.gguf", q8_1_tensor="blk.1.ffn_down.weight")
    line = _serve(tmp_path, path, "--api-server-count", "2")
    assert line.startswith(
        f"helios serve: error: {path}: tensor 'blk.1.ffn_down.weight' has quantization type "
        "Q8_1, which the export cannot dequantize"
    )


@pytest.mark.parametrize("api_servers", ["1", "2"])
def test_serve_refuses_a_port_another_server_listens_on_even_one_that_shares_ports(
    good_dir: Path, tmp_path: Path, api_servers: str
) -> None:
    # What a second `helios serve --api-server-count 2` would meet: each API process of the
    # first listens with SO_REUSEPORT, which would let a same-user listener share the port.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        line = _refused(
            tmp_path,
            *("serve", str(good_dir), "--port", str(port), "--device", "cpu"),
            *("--api-server-count", api_servers),
        )
    assert line == (
        f"helios serve: error: cannot listen on 127.0.0.1:{port}: [Errno 98] Address already in use"
    )


def test_generate_refuses_a_wrong_shape_naming_file_tensor_and_shapes(
    good_dir: Path, tmp_path: Path
) -> None:
    broken = broken_copy(good_dir, tmp_path / "shape")
    edit_tensors(broken, rows_off={"model.layers.0.mlp.up_proj.weight": 1})
    line = _refused(tmp_path, "generate", "--model", str(broken), "--prompt", "hi")
    assert line == (
        f"helios generate: error: {broken / 'model.safetensors'}: tensor "
        "'model.layers.0.mlp.up_proj.weight' has shape (127, 64), expected (128, 64)"
    )


def test_generate_refuses_a_gguf_tensor_type_no_reader_knows(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "unknown.gguf", unknown_type_tensor="blk.0.attn_k.weight")
    line = _refused(tmp_path, "generate", "--model", str(path), "--prompt", "hi")
    assert line.startswith(
        f"helios generate: error: {path}: tensor 'blk.0.attn_k.weight' has GGUF type 99"
    )


def test_export_refuses_a_model_without_a_tokenizer_in_one_line_and_writes_nothing(
    good_dir: Path, tmp_path: Path
) -> None:
    broken = broken_copy(good_dir, tmp_path / "no-tokenizer")
    (broken / "tokenizer.json").unlink()
    output = tmp_path / "core"
    line = _refused(tmp_path, "export", str(broken), "--output", str(output))
    assert line == f"helios export: error: {broken} has no tokenizer.json"
    assert not output.exists()


@pytest.mark.slow
def test_tensor_parallel_generate_shows_one_loading_bar_over_the_checkpoints_tensors(
    good_dir: Path, tmp_path: Path
) -> None:
    finished = _helios(
        tmp_path,
        *("generate", "--model", str(good_dir), "--prompt", "hi", "--max-tokens", "2"),
        *("--device", "cpu", "--max-model-len", "64", "--kv-cache-memory", "1048576"),
        *("--tensor-parallel-size", "2"),
    )
    assert finished.returncode == 0, finished.stderr
    with safe_open(good_dir / "model.safetensors", framework="pt") as checkpoint:
        count = len(checkpoint.keys())
    # tqdm redraws with carriage returns; the last drawing is the finished bar.
    drawn = finished.stderr.replace("\r", "\n").strip().splitlines()
    finished_bars = [line for line in drawn if line.startswith("loading safetensors weights: 100%")]
    # Rank 0 draws it; its peer loads its half of every tensor without a bar.
    assert len(finished_bars) == 1, finished.stderr
    assert drawn[-1] == finished_bars[0]
    assert f" {count}/{count} " in drawn[-1], finished.stderr
