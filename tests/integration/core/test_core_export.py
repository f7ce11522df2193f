"""`helios export` writes cores that load with the capability their logprob level declares."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from adapters.cli.main import main
from adapters.core import core_pb2
from adapters.core.export import CoreSizes, describe_plain_model, export_core, resolve_core
from adapters.core.manifest import (
    MANIFEST_FILE,
    MANIFEST_TEXT_FILE,
    build_manifest,
    load_core,
    read_manifest,
    write_manifest,
)
from domain.contract.capabilities import (
    FULL_LOGPROBS,
    NO_LOGPROBS,
    LogprobCapability,
    natural_top_k_problem,
    selected_ids_problem,
)
from domain.contract.core_validation import CoreValidationError
from tests.support.tiny_serving import build_tiny_model_dir

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model_dir(tmp_path_factory.mktemp("core-source"))


@pytest.fixture(scope="module")
def full_core(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    output = tmp_path_factory.mktemp("cores") / "full"
    assert main(["export", str(model_dir), "--output", str(output), "--logprobs", "full"]) == 0
    return output


def export(model: Path, output: Path, *options: str) -> int:
    return main(["export", str(model), "--output", str(output), *options])


def test_export_without_logprobs_loads_with_k_zero(model_dir: Path, tmp_path: Path) -> None:
    assert export(model_dir, tmp_path / "core", "--logprobs", "none") == 0
    core = load_core(tmp_path / "core")
    assert core.capability == NO_LOGPROBS
    assert [buffer.name for buffer in core.manifest.buffers] == ["completion_records"]


@pytest.mark.parametrize("top_k", [1, 5, 20])
def test_natural_export_loads_with_its_k_and_no_selected_ids(
    model_dir: Path, tmp_path: Path, top_k: int
) -> None:
    options = ("--logprobs", "natural", "--top-k", str(top_k))
    assert export(model_dir, tmp_path / "core", *options) == 0
    core = load_core(tmp_path / "core")
    assert core.capability == LogprobCapability(top_k=top_k, selects_ids=False)


def test_full_export_loads_with_the_complete_contract(full_core: Path) -> None:
    core = load_core(full_core)
    assert core.capability == FULL_LOGPROBS
    assert core.capacity == 16
    assert core.token_capacity == 8
    assert core.model_dir == full_core / "model"
    names = {buffer.name for buffer in core.manifest.buffers}
    assert names == {
        "completion_records",
        "completion_logprobs",
        "logprob_requested",
        "logprob_token_ids",
        "logprob_token_id_counts",
    }


def test_export_reports_what_it_wrote(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert export(model_dir, tmp_path / "core", "--logprobs", "natural", "--top-k", "3") == 0
    assert "capacity 16, T=8, K=3" in capsys.readouterr().out


def test_core_links_the_model_files_and_keeps_a_readable_manifest(
    model_dir: Path, full_core: Path
) -> None:
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        exported = full_core / "model" / name
        assert exported.read_bytes() == (model_dir / name).read_bytes()
        # The same file system allows hard links, so no weight bytes are duplicated.
        assert os.stat(exported).st_ino == os.stat(model_dir / name).st_ino
    text = (full_core / MANIFEST_TEXT_FILE).read_text(encoding="utf-8")
    assert 'name: "completion_logprobs"' in text
    assert "operation: DECODE" in text


def test_capacity_is_padded_and_token_capacity_is_declared(model_dir: Path, tmp_path: Path) -> None:
    options = ("--max-num-seqs", "5", "--token-capacity", "4")
    assert export(model_dir, tmp_path / "core", *options) == 0
    core = load_core(tmp_path / "core")
    assert (core.capacity, core.token_capacity) == (8, 4)
    shapes = {buffer.name: list(buffer.shape) for buffer in core.manifest.buffers}
    assert shapes["completion_records"] == [2, 8, 20]
    assert shapes["completion_logprobs"] == [2, 8, 4, 258]


def test_tampered_shape_fails_loading_with_the_expected_form(
    full_core: Path, tmp_path: Path
) -> None:
    tampered = tmp_path / "tampered"
    export_core(str(full_core), tampered, logprobs="full")
    manifest = read_manifest(tampered)
    (packed,) = [b for b in manifest.buffers if b.name == "completion_logprobs"]
    packed.shape[-1] = 42
    write_manifest(tampered, manifest)
    with pytest.raises(CoreValidationError) as caught:
        load_core(tampered)
    assert "completion_logprobs: expected int32[2, 16, 8, 258], got int32[2, 16, 8, 42]" in str(
        caught.value
    )


def test_tampered_binding_fails_loading_naming_the_graph(full_core: Path, tmp_path: Path) -> None:
    tampered = tmp_path / "tampered"
    export_core(str(full_core), tampered, logprobs="full")
    manifest = read_manifest(tampered)
    (decode,) = [graph for graph in manifest.graphs if graph.name == "decode"]
    kept = [b for b in decode.inputs if b.source != core_pb2.LOGPROB_REQUESTED]
    del decode.inputs[:]
    decode.inputs.extend(kept)
    write_manifest(tampered, manifest)
    with pytest.raises(CoreValidationError, match="graph 'decode': expected input binding "):
        load_core(tampered)


def test_unknown_format_version_fails_loading(full_core: Path, tmp_path: Path) -> None:
    tampered = tmp_path / "tampered"
    export_core(str(full_core), tampered, logprobs="none")
    manifest = read_manifest(tampered)
    manifest.format_version = 2
    write_manifest(tampered, manifest)
    with pytest.raises(CoreValidationError, match="format version 2"):
        load_core(tampered)


def test_garbage_manifest_fails_loading(full_core: Path, tmp_path: Path) -> None:
    tampered = tmp_path / "tampered"
    export_core(str(full_core), tampered, logprobs="none")
    (tampered / MANIFEST_FILE).write_bytes(b"\xff\xff\xff")
    with pytest.raises(CoreValidationError, match="not a core manifest"):
        load_core(tampered)


def test_a_core_exports_again_with_new_logprob_outputs(full_core: Path, tmp_path: Path) -> None:
    assert export(full_core, tmp_path / "none", "--logprobs", "none") == 0
    assert load_core(tmp_path / "none").capability == NO_LOGPROBS
    assert export(tmp_path / "none", tmp_path / "again", "--logprobs", "full") == 0
    assert load_core(tmp_path / "again").capability == FULL_LOGPROBS


def test_export_refuses_a_non_empty_target(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "keep.txt").write_text("mine")
    assert export(model_dir, tmp_path / "core") == 2
    assert "not an empty directory" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path / "core")) == ["keep.txt"]


def test_full_export_with_fewer_alternatives_is_refused_and_leaves_nothing(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert export(model_dir, tmp_path / "core", "--logprobs", "full", "--top-k", "5") == 2
    assert "K=20" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("level", "top_k", "rule"),
    [
        ("full", 5, lambda: selected_ids_problem(5)),
        ("natural", 0, lambda: natural_top_k_problem(0)),
        ("natural", 21, lambda: natural_top_k_problem(21)),
    ],
)
def test_a_manifest_with_a_k_its_level_cannot_have_is_refused_by_the_capability_rule(
    level: str, top_k: int, rule: Callable[[], str | None]
) -> None:
    with pytest.raises(ValueError) as caught:
        build_manifest(
            "LlamaForCausalLM", 49152, logprobs=level, top_k=top_k, capacity=16, token_capacity=0
        )

    assert str(caught.value) == rule()


def test_plain_model_is_described_as_a_full_core_without_writing(model_dir: Path) -> None:
    before = sorted(os.listdir(model_dir))
    core = describe_plain_model(model_dir, sizes=CoreSizes(max_num_seqs=12))
    assert core.capability == FULL_LOGPROBS
    assert (core.model_dir, core.capacity, core.token_capacity) == (model_dir, 16, 8)
    assert core.manifest.model.architecture == "LlamaForCausalLM"
    assert sorted(os.listdir(model_dir)) == before


def test_serving_resolves_cores_as_declared_and_plain_models_as_full(
    model_dir: Path, full_core: Path, tmp_path: Path
) -> None:
    export_core(str(model_dir), tmp_path / "natural", logprobs="natural", top_k=2)
    assert resolve_core(str(tmp_path / "natural")).capability.top_k == 2
    assert resolve_core(str(full_core)).capability == FULL_LOGPROBS
    plain = resolve_core(str(model_dir), sizes=CoreSizes(max_num_seqs=20))
    assert (plain.capability, plain.capacity) == (FULL_LOGPROBS, 24)
