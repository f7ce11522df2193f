"""The committed core_pb2 is exactly what protoc generates from contracts/core.proto."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from adapters.core import core_pb2
from domain.contract.declarations import DTYPES, OPERATIONS, VALUE_SOURCES

REPO_ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("core_pb2.py", "core_pb2.pyi")
# Mapping contracts/ onto the package path registers the file as adapters/core/core.proto and
# names the module adapters.core.core_pb2, as the import system sees it.
PROTOC_ARGUMENTS = (
    "-Iadapters/core=contracts",
    "--python_out={out}",
    "--pyi_out={out}",
    "adapters/core/core.proto",
)


def _regenerate(out: Path) -> None:
    if importlib.util.find_spec("grpc_tools") is None:
        pytest.fail("grpcio-tools is not installed; it is pinned in requirements.lock (make venv)")
    arguments = [argument.format(out=out) for argument in PROTOC_ARGUMENTS]
    completed = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", *arguments],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr


@pytest.mark.parametrize("name", GENERATED)
def test_committed_code_equals_a_fresh_protoc_run_byte_for_byte(name: str, tmp_path: Path) -> None:
    _regenerate(tmp_path)
    fresh = (tmp_path / "adapters" / "core" / name).read_bytes()
    committed = (REPO_ROOT / "adapters" / "core" / name).read_bytes()
    assert committed == fresh, (
        f"adapters/core/{name} is stale: run python -m grpc_tools.protoc "
        f"{' '.join(PROTOC_ARGUMENTS).format(out='.')} from the repository root"
    )


def test_seed_numbers_for_prompt_scoring_are_fixed() -> None:
    assert core_pb2.Operation.Value("SCORED_PREFILL") == 12
    assert core_pb2.ValueSource.Value("PROMPT_TARGET_TOKEN") == 39


def _reserved(enum_name: str) -> set[int]:
    descriptor = core_pb2.DESCRIPTOR.enum_types_by_name[enum_name]
    proto = descriptor_pb2.EnumDescriptorProto()
    descriptor.CopyToProto(proto)
    # Enum reserved ranges are inclusive at both ends.
    return {n for span in proto.reserved_range for n in range(span.start, span.end + 1)}


@pytest.mark.parametrize(("enum_name", "last"), [("Operation", 12), ("ValueSource", 39)])
def test_every_number_below_the_seed_number_is_defined_or_reserved(
    enum_name: str, last: int
) -> None:
    defined = set(getattr(core_pb2, enum_name).values())
    reserved = _reserved(enum_name)
    assert not defined & reserved
    assert defined | reserved == set(range(last + 1))


def _names(enum_name: str) -> set[str]:
    """The enum's value names, less its zero UNSPECIFIED default."""
    values = core_pb2.DESCRIPTOR.enum_types_by_name[enum_name].values
    return {value.name for value in values if value.number != 0}


def test_domain_vocabulary_matches_the_proto_enums() -> None:
    # The domain validates names it cannot import from protobuf; the two lists must not drift.
    assert _names("Operation") == set(OPERATIONS)
    assert _names("ValueSource") == set(VALUE_SOURCES)
    assert {name.lower() for name in _names("DType")} == set(DTYPES)
