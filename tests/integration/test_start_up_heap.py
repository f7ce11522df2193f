"""A served process freezes its start-up heap once its model is loaded (adapters.cli.heap)."""

from __future__ import annotations

import gc

import pytest

from adapters.cli import asgi
from adapters.cli.heap import freeze_start_up_heap
from adapters.cli.serve_config import ServeConfig


@pytest.fixture
def thawed():
    yield
    gc.unfreeze()


class _Held:
    """A start-up object in a cycle, which only a full collection would otherwise walk."""

    def __init__(self) -> None:
        self.me = self


def test_freezing_moves_what_start_up_left_out_of_the_collected_generations(thawed):
    held = _Held()
    assert gc.is_tracked(held) and any(o is held for o in gc.get_objects())

    freeze_start_up_heap()

    assert gc.get_freeze_count() > 0
    assert not any(o is held for o in gc.get_objects())
    assert held.me is held


@pytest.mark.parametrize("api_server_count", [1, 2])
def test_the_app_s_loader_freezes_the_heap_after_the_model_is_loaded(monkeypatch, api_server_count):
    calls: list[str] = []
    loaders = []
    served = object()

    def load(*args):
        calls.append("load")
        return served

    monkeypatch.setattr(asgi, "load_served_model", load)
    monkeypatch.setattr(asgi, "connect_served_model", load)
    monkeypatch.setattr(asgi, "freeze_start_up_heap", lambda: calls.append("freeze"))
    monkeypatch.setattr(asgi, "ModelHolder", lambda loader: loaders.append(loader) or loader)
    monkeypatch.setattr(asgi, "create_http_app", lambda holder, settings, metrics: settings)
    # An API process lowers its priority as the app is made; this test process must not.
    monkeypatch.setattr(asgi, "yield_cpu_to_engine", lambda nice: calls.append(f"nice {nice}"))

    settings = asgi.create_app(ServeConfig(api_server_count=api_server_count))

    assert settings.name_process is (api_server_count > 1)
    assert calls == (["nice 5"] if api_server_count > 1 else [])
    calls.clear()
    assert loaders[0]() is served
    assert calls == ["load", "freeze"]
