"""Render a model's Jinja chat template in a sandbox, with the helpers transformers offers."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any


def render_chat_template(
    template: str,
    messages: Sequence[Mapping[str, object]],
    *,
    add_generation_prompt: bool = True,
    bos_token: str | None = None,
    eos_token: str | None = None,
) -> str:
    """The prompt text `template` makes of `messages`; ValueError when the template fails."""
    import jinja2

    compiled = _compile(template)
    try:
        return compiled.render(
            messages=[dict(message) for message in messages],
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token or "",
            eos_token=eos_token or "",
        )
    except jinja2.TemplateError as error:
        raise ValueError(f"chat template failed: {error}") from error


@lru_cache(maxsize=16)
def _compile(template: str) -> Any:
    # Parsing is the slow part and a server renders the same template for every request.
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    # Templates are written against transformers, which trims block whitespace this way.
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    environment.filters["tojson"] = _to_json
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    try:
        return environment.from_string(template)
    except jinja2.TemplateSyntaxError as error:
        raise ValueError(f"chat template does not parse: {error}") from error


def _raise_exception(message: str) -> None:
    import jinja2

    raise jinja2.TemplateError(message)


def _to_json(
    value: object,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes HTML characters, which would corrupt prompts.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format_string: str) -> str:
    return datetime.now().strftime(format_string)
