"""The Triton logprob kernels compile for a CUDA GPU, checked on machines without one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_every_logprob_kernel_compiles_for_a_cuda_gpu_without_one():
    # A fresh process: a module that imported triton under TRITON_INTERPRET holds interpreted
    # kernels, which the compiler cannot take.
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    finished = subprocess.run(
        [sys.executable, "-m", "tests.support.cuda_compile"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )

    assert finished.returncode == 0, finished.stdout + finished.stderr[-2000:]
    assert finished.stdout.count("compiles") == 16, finished.stdout
