"""`quick_init`: the same objects as the dataclass's own `__init__`, built faster."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import InitVar, dataclass, field

import pytest

from domain.common.frozen import quick_init
from domain.contract.records import CompletionRecord, Role


def _record_class() -> type:
    """A fresh frozen slotted dataclass with defaults and a check, as the served ones are."""

    @dataclass(frozen=True, slots=True)
    class Record:
        slot: int
        epoch: int
        tokens: tuple[int, ...] = ()
        finish: str | None = None

        def __post_init__(self) -> None:
            if self.slot < 0:
                raise ValueError("slot must be non-negative")

    return Record


Plain = _record_class()
Quick = quick_init(_record_class())


@quick_init
@dataclass(frozen=True, slots=True)
class Unchecked:
    slot: int


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((1, 2), {}),
        ((1, 2, (3, 4)), {}),
        ((1,), {"epoch": 5, "finish": "stop"}),
        ((), {"slot": 0, "epoch": 0, "tokens": (9,)}),
    ],
)
def test_a_quick_init_sets_every_field_as_the_dataclass_init_does(args, kwargs):
    quick, plain = Quick(*args, **kwargs), Plain(*args, **kwargs)

    assert dataclasses.astuple(quick) == dataclasses.astuple(plain)
    assert repr(quick) == repr(plain)


def test_a_quick_init_takes_the_dataclass_signature_and_rejects_what_it_rejects():
    assert str(inspect.signature(Quick)) == str(inspect.signature(Plain))
    with pytest.raises(TypeError):
        Quick(1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Quick(1, 2, unknown=3)  # type: ignore[call-arg]
    assert Unchecked(4).slot == 4


def test_a_quick_init_still_runs_the_checks_and_the_object_stays_frozen():
    with pytest.raises(ValueError, match="non-negative"):
        Quick(-1, 0)
    quick = Quick(1, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        quick.slot = 3  # type: ignore[misc]
    assert dataclasses.replace(quick, epoch=7) == Quick(1, 7)


def test_a_served_value_object_built_by_quick_init_keeps_its_checks():
    record = CompletionRecord(1, 2, Role.SAMPLE, (5,), first_position=7)

    assert (record.slot, record.tokens, record.first_position, record.drafts_offered) == (
        1,
        (5,),
        7,
        0,
    )
    with pytest.raises(ValueError, match="cannot emit tokens"):
        CompletionRecord(1, 2, Role.PROMPT, (5,))


def _mutable() -> type:
    @dataclass(slots=True)
    class Mutable:
        slot: int

    return Mutable


def _unslotted() -> type:
    @dataclass(frozen=True)
    class Unslotted:
        slot: int

    return Unslotted


def _factory() -> type:
    @dataclass(frozen=True, slots=True)
    class Factory:
        blocks: list[int] = field(default_factory=list)

    return Factory


def _keyword_only() -> type:
    @dataclass(frozen=True, slots=True, kw_only=True)
    class KeywordOnly:
        slot: int

    return KeywordOnly


def _not_in_init() -> type:
    @dataclass(frozen=True, slots=True)
    class NotInInit:
        slot: int
        epoch: int = field(default=0, init=False)

    return NotInInit


def _init_var() -> type:
    @dataclass(frozen=True, slots=True)
    class WithInitVar:
        slot: int
        scale: InitVar[int] = 1

    return WithInitVar


@pytest.mark.parametrize(
    "build", [_mutable, _unslotted, _factory, _keyword_only, _not_in_init, _init_var]
)
def test_a_class_quick_init_cannot_build_alike_is_refused_when_it_is_made(build):
    with pytest.raises(TypeError):
        quick_init(build())
