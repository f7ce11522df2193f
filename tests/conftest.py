"""Suite-wide pytest set-up: gpu auto-skip, model-marker guard, quiet tokenizers, Hypothesis."""

from __future__ import annotations

import os
import shutil
from collections import Counter

import pytest
from hypothesis import settings

from tests.support import marker_guard

# CI runners are small and shared, so a slow example is not a failing one; derandomize keeps
# a red run reproducible. HYPOTHESIS_PROFILE=dev explores fresh examples on every run.
settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
settings.register_profile("dev", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config: pytest.Config) -> None:
    # The guard: a test that builds a model, spawns a gloo world or starts a server carries
    # its marker, so `make test-fast` leaves it out.
    config.pluginmanager.register(marker_guard, "helios-marker-guard")
    # The Rust tokenizer pool warns, and can deadlock, when xdist or a server forks after use.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Without a GPU, Triton kernels run in its interpreter, chosen before triton is imported.
    if shutil.which("nvidia-smi") is None:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    _share_the_cores()


def _share_the_cores() -> None:
    """Gives each xdist worker (and the servers and ranks it starts) its share of the cores.

    torch's intra-op pool takes every core in every process; two workers on two cores then
    spin against each other. Measured on the 2-core box, two heavy modules side by side: 91 s
    with the default pools, 67 s with one thread each (user time 149 s against 92 s). Set
    before any test module imports torch, so the pools start at this size; an explicit
    OMP_NUM_THREADS wins.
    """
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        share = max(1, (os.cpu_count() or 1) // workers)
        os.environ.setdefault("OMP_NUM_THREADS", str(share))


def _cuda_unavailable_reason() -> str | None:
    """Why CUDA tests cannot run here, or None when a CUDA device is usable."""
    try:
        import torch
    except ImportError:
        return "needs a CUDA device: torch is not installed"
    if not torch.cuda.is_available():
        return "needs a CUDA device: torch.cuda.is_available() is False on this machine"
    return None


# trylast: run after `-m` deselection, so a `-m "not gpu"` run never imports torch here.
@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _give_each_item_its_own_id(items)
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        # Importing torch costs seconds; runs without gpu tests never pay it.
        return
    reason = _cuda_unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in gpu_items:
        item.add_marker(skip)


def _give_each_item_its_own_id(items: list[pytest.Item]) -> None:
    """Schemathesis IDs every operation's item after the test function alone; xdist's
    `--dist loadfile` keys work by node ID, so nine of ten operations silently never ran. Each
    such item gets its name (which holds the operation) in its ID, as pytest would give it, and
    any other ID collected twice stops the run."""
    for item in items:
        if getattr(item, "operation_label", None) is not None and item.parent is not None:
            # pytest 9 keeps the ID structured in `_id`; the parent's ID plus the item's name
            # is how pytest itself builds one.
            item._id = item.parent.id.child(item.name)
    counts = Counter(item.nodeid for item in items)
    repeated = sorted(nodeid for nodeid, count in counts.items() if count > 1)
    if repeated:
        raise pytest.UsageError(f"test IDs collected more than once: {repeated}")
