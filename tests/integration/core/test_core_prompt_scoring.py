"""Cores declare prompt scoring only under --prompt-logprobs; serving honours what they declare."""

from __future__ import annotations

import argparse
import hashlib
import os
from pathlib import Path

import pytest

from adapters.cli import bootstrap
from adapters.cli.main import main
from adapters.cli.runner_args import add_runner_arguments, engine_config, runner_settings
from adapters.core import core_pb2
from adapters.core.export import CoreSizes, describe_plain_model, export_core, resolve_core
from adapters.core.manifest import (
    MANIFEST_TEXT_FILE,
    build_manifest,
    core_from_manifest,
    load_core,
    read_manifest,
    write_manifest,
)
from domain.contract.capabilities import FULL_LOGPROBS, LogprobCapability, scoring_problem
from domain.contract.core_validation import CoreValidationError
from tests.support.tiny_serving import build_tiny_model_dir

ORDINARY_INPUTS = [
    "input_tokens",
    "positions",
    "block_tables",
    "slot_mapping",
    "sampling_parameters",
]
FULL_INPUTS = [
    *ORDINARY_INPUTS,
    "logprob_requested",
    "logprob_token_ids",
    "logprob_token_id_counts",
    "prompt_target_tokens",
]
# SHA-256 of the serialized manifests as they were before prompt scoring existed: with the flag
# off, every level must still produce these exact bytes.
MANIFESTS_BEFORE_SCORING = {
    ("none", 20, 16, 0): "e10966b57bb6bb1f8b30b52bf4079de78a7e8e4ed4cb3bd06a0f384532f9ebba",
    ("none", 20, 8, 4): "9df65933fe02c5655fb0b02313e44cbd558aedb49047ca4f1d416088bfce4024",
    ("natural", 20, 16, 0): "c8532ccf48ee0a0b60c9b993bae6d8f611b7781fb24109ba2879763b962661b5",
    ("natural", 20, 8, 4): "a5d1ce1ad969baca0afea4b003c2fa91ab77a170028e2020c2851d7d892f064e",
    ("natural", 5, 16, 0): "733dbdbe5d926cdc2ed1815b5b1f3a57e88b399b5d296cac42dc053fd742e14f",
    ("natural", 5, 8, 4): "5a6331787e583071152a641c5fbeba2ef43def9d34b531c809b8dba3959bceb5",
    ("full", 20, 16, 0): "3b47d9429f7ec393efa6cacebe1d83dd357616d8af9ddd1a90e25f36b88b193b",
    ("full", 20, 8, 4): "ae73e88eedad2a9bfd919495bcd10193152f6ef48ffa81902da76ca3c3ca4322",
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model_dir(tmp_path_factory.mktemp("scoring-source"))


@pytest.fixture(scope="module")
def scoring_core(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    output = tmp_path_factory.mktemp("scoring-cores") / "scoring"
    assert main(["export", str(model_dir), "--output", str(output), "--prompt-logprobs"]) == 0
    return output


@pytest.fixture(scope="module")
def plain_core(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    output = tmp_path_factory.mktemp("plain-cores") / "plain"
    export_core(str(model_dir), output, logprobs="full")
    return output


def export(model: Path, output: Path, *options: str) -> int:
    return main(["export", str(model), "--output", str(output), *options])


def manifest(logprobs: str = "full", top_k: int = 20, limit: int = 0) -> core_pb2.CoreManifest:
    return build_manifest(
        "LlamaForCausalLM",
        49152,
        logprobs=logprobs,
        top_k=top_k,
        capacity=16,
        token_capacity=0,
        prompt_chunk_limit=limit,
    )


@pytest.mark.model
@pytest.mark.parametrize(("level", "top_k", "capacity", "t"), list(MANIFESTS_BEFORE_SCORING))
def test_manifest_without_the_flag_keeps_its_bytes_from_before_prompt_scoring(
    level: str, top_k: int, capacity: int, t: int
) -> None:
    built = build_manifest(
        "LlamaForCausalLM", 49152, logprobs=level, top_k=top_k, capacity=capacity, token_capacity=t
    )
    digest = hashlib.sha256(built.SerializeToString(deterministic=True)).hexdigest()
    assert digest == MANIFESTS_BEFORE_SCORING[(level, top_k, capacity, t)]


@pytest.mark.parametrize(("level", "top_k"), [("full", 20), ("natural", 20)])
def test_scoring_appends_to_the_ordinary_declarations_without_changing_them(
    level: str, top_k: int
) -> None:
    ordinary, scoring = manifest(level, top_k), manifest(level, top_k, limit=512)
    count = len(ordinary.buffers)
    assert list(scoring.buffers)[:count] == list(ordinary.buffers)
    assert list(scoring.graphs)[:2] == list(ordinary.graphs)
    prompt = {buffer.name: (buffer.dtype, list(buffer.shape)) for buffer in scoring.buffers[count:]}
    assert prompt == {
        "prompt_logprobs": (core_pb2.INT32, [2, 512, 43]),
        "prompt_target_tokens": (core_pb2.INT32, [512]),
    }


def test_scored_graphs_bind_the_prefill_logprob_and_target_inputs_and_write_prompt_rows() -> None:
    scoring = manifest(limit=2048)
    scored = list(scoring.graphs)[2:]
    assert [graph.name for graph in scored] == [
        "scored_prefill_128",
        "scored_prefill_512",
        "scored_prefill_2048",
    ]
    for graph in scored:
        assert graph.operation == core_pb2.SCORED_PREFILL
        assert [binding.input for binding in graph.inputs] == FULL_INPUTS
        assert graph.inputs[-1].source == core_pb2.PROMPT_TARGET_TOKEN
        assert list(graph.outputs) == [
            "completion_records",
            "completion_logprobs",
            "prompt_logprobs",
        ]


def test_natural_scored_graphs_bind_only_the_flag_among_logprob_inputs() -> None:
    (graph, *_) = list(manifest("natural", 20, limit=512).graphs)[2:]
    assert [binding.input for binding in graph.inputs] == [
        *ORDINARY_INPUTS,
        "logprob_requested",
        "prompt_target_tokens",
    ]


@pytest.mark.parametrize(
    ("limit", "capacities"),
    [(512, (128, 512)), (2048, (128, 512, 2048)), (1000, (128, 512, 1000)), (100, (100,))],
)
def test_scoring_manifest_loads_with_the_ladder_of_its_chunk_limit(
    limit: int, capacities: tuple[int, ...]
) -> None:
    core = core_from_manifest(Path("model"), manifest(limit=limit))
    assert core.capability.scored_capacities == capacities
    assert (core.capability.top_k, core.capability.selects_ids) == (20, True)


@pytest.mark.parametrize(("level", "top_k"), [("none", 20), ("natural", 5), ("natural", 19)])
def test_scoring_is_refused_without_twenty_generation_alternatives(level: str, top_k: int) -> None:
    with pytest.raises(ValueError, match="prompt scoring requires K=20"):
        manifest(level, top_k, limit=512)


@pytest.mark.parametrize(("level", "top_k", "generation_k"), [("none", 20, 0), ("natural", 5, 5)])
def test_the_manifest_refuses_scoring_with_the_sentence_of_the_capability_rule(
    level: str, top_k: int, generation_k: int
) -> None:
    with pytest.raises(ValueError) as caught:
        manifest(level, top_k, limit=512)

    assert str(caught.value) == scoring_problem(generation_k)


def test_a_negative_chunk_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="prompt_chunk_limit"):
        manifest(limit=-1)


@pytest.mark.model
def test_export_with_prompt_logprobs_declares_the_default_ladder(scoring_core: Path) -> None:
    core = load_core(scoring_core)
    assert core.capability == LogprobCapability(20, True, scored_capacities=(128, 512))
    assert "operation: SCORED_PREFILL" in (scoring_core / MANIFEST_TEXT_FILE).read_text("utf-8")


@pytest.mark.model
def test_export_reports_the_scored_capacities_of_its_chunk_limit(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    options = ("--prompt-logprobs", "--max-num-batched-tokens", "1000")
    assert export(model_dir, tmp_path / "core", *options) == 0
    assert "prompt scoring at capacities 128, 512, 1000" in capsys.readouterr().out
    assert load_core(tmp_path / "core").capability.scored_capacities == (128, 512, 1000)


@pytest.mark.model
def test_export_without_the_flag_declares_no_scoring_whatever_the_chunk_limit(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert export(model_dir, tmp_path / "core", "--max-num-batched-tokens", "2048") == 0
    assert "no prompt scoring" in capsys.readouterr().out
    core = load_core(tmp_path / "core")
    assert core.capability == FULL_LOGPROBS
    model = core.manifest.model
    ordinary = build_manifest(
        model.architecture, model.vocab_size, logprobs="full", capacity=16, token_capacity=0
    )
    assert core.manifest == ordinary


@pytest.mark.model
def test_natural_export_with_twenty_alternatives_scores_prompts(
    model_dir: Path, tmp_path: Path
) -> None:
    options = ("--logprobs", "natural", "--top-k", "20", "--prompt-logprobs")
    assert export(model_dir, tmp_path / "core", *options) == 0
    capability = load_core(tmp_path / "core").capability
    assert (capability.selects_ids, capability.scored_capacities) == (False, (128, 512))


@pytest.mark.model
@pytest.mark.parametrize(
    "options",
    [
        ("--logprobs", "natural", "--top-k", "5"),
        ("--logprobs", "none"),
        ("--max-num-batched-tokens", "0"),
    ],
)
def test_export_refuses_scoring_it_cannot_declare_and_leaves_nothing(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], options: tuple[str, ...]
) -> None:
    assert export(model_dir, tmp_path / "core", "--prompt-logprobs", *options) == 2
    assert capsys.readouterr().err.startswith("error: ")
    assert os.listdir(tmp_path) == []


@pytest.mark.model
def test_core_missing_a_scored_graph_fails_loading(scoring_core: Path, tmp_path: Path) -> None:
    tampered = tmp_path / "tampered"
    export_core(str(scoring_core), tampered, sizes=CoreSizes(prompt_chunk_limit=512))
    manifest = read_manifest(tampered)
    kept = [graph for graph in manifest.graphs if graph.name != "scored_prefill_128"]
    del manifest.graphs[:]
    manifest.graphs.extend(kept)
    write_manifest(tampered, manifest)
    with pytest.raises(CoreValidationError, match="expected 2 SCORED_PREFILL graphs for C=512"):
        load_core(tampered)


@pytest.mark.model
def test_plain_model_is_described_with_scoring_only_when_asked(model_dir: Path) -> None:
    assert describe_plain_model(model_dir).capability == FULL_LOGPROBS
    scoring = describe_plain_model(model_dir, sizes=CoreSizes(prompt_chunk_limit=2048))
    assert scoring.capability.scored_capacities == (128, 512, 2048)
    assert scoring.capability.selects_ids


@pytest.mark.model
def test_serving_a_plain_model_with_a_chunk_limit_scores_at_its_ladder(model_dir: Path) -> None:
    assert resolve_core(
        str(model_dir), sizes=CoreSizes(prompt_chunk_limit=100)
    ).capability.scored_capacities == (100,)
    assert not resolve_core(str(model_dir)).capability.scores_prompts


@pytest.mark.model
def test_asking_a_core_without_scoring_for_it_says_to_export_again(plain_core: Path) -> None:
    assert resolve_core(str(plain_core)).capability == FULL_LOGPROBS
    with pytest.raises(ValueError, match="export it again with --prompt-logprobs"):
        resolve_core(str(plain_core), sizes=CoreSizes(prompt_chunk_limit=512))


@pytest.mark.model
@pytest.mark.parametrize("limit", [0, 512, 2048])
def test_a_core_that_declares_scoring_serves_it_as_declared(scoring_core: Path, limit: int) -> None:
    core = resolve_core(str(scoring_core), sizes=CoreSizes(prompt_chunk_limit=limit))
    assert core.capability.scored_capacities == (128, 512)


def _runner_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_runner_arguments(parser)
    return parser.parse_args(list(argv))


def test_runner_flag_defaults_off_and_maps_to_the_settings() -> None:
    assert not runner_settings(_runner_args()).prompt_logprobs
    assert runner_settings(_runner_args("--prompt-logprobs")).prompt_logprobs


class _Resolved(Exception):
    """Stops bootstrap right after it has resolved the core."""


@pytest.mark.model
@pytest.mark.parametrize(("flag", "expected"), [((), 0), (("--prompt-logprobs",), 1000)])
def test_loading_asks_for_scoring_at_the_engine_chunk_limit_only_under_the_flag(
    monkeypatch: pytest.MonkeyPatch, flag: tuple[str, ...], expected: int
) -> None:
    seen: list[CoreSizes] = []

    def resolve(model: str | None, sizes: CoreSizes, progress: bool = True) -> None:
        seen.append(sizes)
        raise _Resolved

    monkeypatch.setattr(bootstrap, "resolve_core", resolve)
    args = _runner_args("--max-num-batched-tokens", "1000", *flag)
    with pytest.raises(_Resolved):
        bootstrap.load("some-model", runner_settings(args), engine_config(args))
    assert [sizes.prompt_chunk_limit for sizes in seen] == [expected]
