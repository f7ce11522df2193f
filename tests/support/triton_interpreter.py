"""Spares Triton's interpreter re-patching triton.language on every device-function call."""

from __future__ import annotations

import inspect


def patch_language_once_per_launch() -> bool:
    """Within one interpreted launch, a device function that sees only language modules the
    launch has patched already skips patching them again; returns whether it was installed.

    The interpreter patches `triton.language` (and `triton.language.core`) with its numpy
    builtins when a launch starts and restores them when it ends, but also re-patches the same
    module objects on every device-function call of every program: in the vocabulary-parallel
    kernels that was about half of all interpreter time. The repeated patch installs the same
    wrappers on the same objects, so skipping it changes no value a kernel computes. Call it
    after TRITON_INTERPRET is set; with another interpreter layout it installs nothing.
    """
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    patch = getattr(interpreter, "_patch_lang", None)
    executor = getattr(interpreter, "GridExecutor", None)
    scope_type = getattr(interpreter, "_LangPatchScope", None)
    if None in (patch, executor, scope_type) or getattr(patch, "once_per_launch", False):
        return False
    launch = executor.__call__
    # The language modules the running launch has patched; None between launches.
    patched: list[set[int] | None] = [None]

    def launching(self, *args, **kwargs):
        patched[0] = set()
        try:
            return launch(self, *args, **kwargs)
        finally:
            patched[0] = None

    def patch_once(fn):
        visible = {
            id(value)
            for value in fn.__globals__.values()
            if inspect.ismodule(value) and value in (tl, tl.core)
        }
        during = patched[0]
        if during and visible and visible <= during:
            return scope_type()  # restored by nobody, as the interpreter's own device scopes
        scope = patch(fn)
        if during is not None:
            during.update(visible)
        return scope

    patch_once.once_per_launch = True  # type: ignore[attr-defined]
    interpreter._patch_lang = patch_once  # noqa: SLF001
    executor.__call__ = launching
    return True
