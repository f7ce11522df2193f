"""Fails a test that does costly work without the marker that lets a quick run leave it out.

`make test-fast` deselects `model`, `slow` and `e2e`, so an unmarked test that builds weights,
spawns a gloo world or starts a server would slow the inner loop unseen. Costly helpers call
`require(marker, what)`; `model` is also required whenever a whole model (our decoder or a
transformers one) is constructed in this process, wherever the test built it. Work done while
a fixture is set up makes every test that requests that fixture need the marker too (a
module-scoped fixture is set up once, for the first test that asks). Models built only in
child processes are not seen; the test that spawns those children needs `slow` or `e2e`.
"""

from __future__ import annotations

import functools
import sys

import pytest

# Whole models, by a class in their MRO: our decoder and every transformers reference model.
# Their parts (rotary embeddings, activations) hold no weights of a checkpoint and pass.
MODEL_CLASSES = {"DecoderModel": "adapters.", "PreTrainedModel": "transformers."}


def _is_model(module: object) -> bool:
    return any(
        cls.__module__.startswith(MODEL_CLASSES.get(cls.__name__, "\0"))
        for cls in type(module).__mro__
    )


# A fixture as one test gets it: which definition (names repeat across modules), which param.
FixtureKey = tuple[int, str]


def _key(fixturedef: pytest.FixtureDef, param: object) -> FixtureKey:
    return id(fixturedef), repr(param)


class _Guard:
    def __init__(self) -> None:
        self.item: pytest.Item | None = None
        self.fixtures: list[tuple[str, FixtureKey]] = []
        # the fixture -> marker -> what it did
        self.costly_fixtures: dict[FixtureKey, dict[str, str]] = {}
        self.offence: str | None = None
        self.watching_models = False

    def watch_models(self) -> None:
        """Wraps `torch.nn.Module.__init__` once torch has been imported, never importing it."""
        torch = sys.modules.get("torch")
        if self.watching_models or torch is None:
            return
        original = torch.nn.Module.__init__

        @functools.wraps(original)
        def observed_init(module, *args, **kwargs) -> None:
            original(module, *args, **kwargs)
            if _is_model(module):
                self.require("model", f"it built a {type(module).__qualname__}")

        torch.nn.Module.__init__ = observed_init
        self.watching_models = True

    def require(self, marker: str, what: str) -> None:
        for _, key in self.fixtures[-1:]:
            self.costly_fixtures.setdefault(key, {}).setdefault(marker, what)
        item = self.item
        if item is not None and item.get_closest_marker(marker) is None and self.offence is None:
            self.offence = f"needs @pytest.mark.{marker}: {what}"

    def start(self, item: pytest.Item) -> None:
        self.item, self.offence = item, None
        for name, key in _fixtures_of(item):
            for marker, what in self.costly_fixtures.get(key, {}).items():
                if item.get_closest_marker(marker) is None and self.offence is None:
                    self.offence = f"needs @pytest.mark.{marker}: its fixture {name} {what}"


def _fixtures_of(item: pytest.Item) -> list[tuple[str, FixtureKey]]:
    """The fixtures `item` requests, each as the definition and param it gets."""
    definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    params = getattr(getattr(item, "callspec", None), "params", {})
    return [
        (name, _key(definitions[name][-1], params.get(name)))
        for name in getattr(item, "fixturenames", ())
        if definitions.get(name)
    ]


_GUARD = _Guard()


def require(marker: str, what: str) -> None:
    """Records that the running test (or the fixture being set up) did work that needs
    `marker`; the test fails at teardown if it lacks it. `what` begins with "it"."""
    _GUARD.require(marker, what)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _GUARD.watch_models()
    _GUARD.start(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest):
    _GUARD.watch_models()
    key = _key(fixturedef, getattr(request, "param", None))
    _GUARD.fixtures.append((fixturedef.argname, key))
    try:
        yield
    finally:
        _GUARD.fixtures.pop()


# trylast: after the test's fixtures are torn down, so the failure is the teardown's last word.
@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    offence, _GUARD.offence, _GUARD.item = _GUARD.offence, None, None
    if offence is not None:
        pytest.fail(f"{item.nodeid} {offence}", pytrace=False)
