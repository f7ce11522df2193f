"""The marker guard fails a test that builds a model or spawns a world without its marker."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

# A stand-in for torch: the guard watches `torch.nn.Module`, whichever module that is, and the
# stand-in keeps this test free of torch's seconds of import.
CONFTEST = """
import sys
import types


class Module:
    def __init__(self):
        pass


sys.modules["torch"] = types.SimpleNamespace(nn=types.SimpleNamespace(Module=Module))

from tests.support.marker_guard import (  # noqa: E402
    pytest_fixture_setup,
    pytest_runtest_setup,
    pytest_runtest_teardown,
)
"""

TESTS = """
import sys

import pytest

from tests.support.marker_guard import require


def module_class(name, module):
    return type(name, (sys.modules["torch"].nn.Module,), {"__module__": module})


def build_model():
    return module_class("DecoderModel", "adapters.gpu.model.decoder")()


@pytest.fixture(scope="module")
def weights():
    return build_model()


# The marked param is set up first, so the unmarked one must not inherit its verdict.
@pytest.fixture(scope="module", params=[pytest.param("real", marks=pytest.mark.model), "fake"])
def executor(request):
    if request.param == "real":
        build_model()
    return request.param


@pytest.mark.model
def test_marked_builder_passes():
    build_model()


def test_unmarked_builder_fails():
    build_model()


def test_a_part_of_a_model_needs_no_marker():
    module_class("RotaryEmbedding", "adapters.gpu.model.rope")()
    sys.modules["torch"].nn.Module()


def test_an_unmarked_transformers_model_fails():
    pretrained = module_class("PreTrainedModel", "transformers.modeling_utils")
    type("LlamaForCausalLM", (pretrained,), {"__module__": "transformers.models.llama"})()


@pytest.mark.model
def test_marked_first_user_of_a_costly_fixture_passes(weights):
    pass


def test_unmarked_later_user_of_a_costly_fixture_fails(weights):
    pass


def test_each_param_of_a_fixture_counts_on_its_own(executor):
    pass


def test_unmarked_gloo_world_fails():
    require("slow", "it spawned gloo worlds")


@pytest.mark.slow
def test_marked_gloo_world_passes():
    require("slow", "it spawned gloo worlds")
"""


def test_the_guard_fails_exactly_the_unmarked_costly_tests(tmp_path: Path):
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (tmp_path / "test_guarded.py").write_text(textwrap.dedent(TESTS))
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    model\n    slow\n")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
        timeout=120,
    )

    errors = sorted(_named(run.stdout, "ERROR"))
    passed = _named(run.stdout, "PASSED")
    assert errors == [
        "test_an_unmarked_transformers_model_fails",
        "test_unmarked_builder_fails",
        "test_unmarked_gloo_world_fails",
        "test_unmarked_later_user_of_a_costly_fixture_fails",
    ], run.stdout
    assert "needs @pytest.mark.model: it built a DecoderModel" in run.stdout
    assert "needs @pytest.mark.model: it built a LlamaForCausalLM" in run.stdout
    assert "needs @pytest.mark.model: its fixture weights it built a DecoderModel" in run.stdout
    assert "needs @pytest.mark.slow: it spawned gloo worlds" in run.stdout
    # A failing test's call passed; its teardown is where the guard fails it.
    assert len(passed) == 10 and "[real]" in run.stdout and "[fake]" in run.stdout, run.stdout


def _named(output: str, outcome: str) -> list[str]:
    """The tests of the short summary's lines for `outcome`, params included."""
    lines = output.splitlines()
    return [line.split("::")[1].split(" ")[0] for line in lines if line.startswith(outcome + " ")]
