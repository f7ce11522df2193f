"""Chat `logprobs` objects written as JSON text from per-token templates.

Built as presentation's objects (`chat_logprobs`: a dict and a copied byte list per
alternative) and then encoded, the logprobs of a K=20 chat chunk were the largest host cost of
a K=20 stream (docs/performance.md, issue 21). A token's JSON is fixed per token ID but for its
logprob (`{"token":"x","logprob":%b,"bytes":[120]}`), so it is encoded once per server as a
bytes template; a position joins its tokens' templates and fills in the values' text with one
`%`: a whole K=20 chunk (logprobs, chunk, SSE frame) took 20 us of CPU before and 13 us after,
in process on the 2-core dev box. The bytes equal `wire_json.encode` of presentation's objects
(tests/integration/http/test_logprob_json.py).

A position whose alternatives are still a frame's bytes (`PositionLogprobs.packed`, as every
served position arrives) and whose values all lie where the wire's text is `repr`'s goes
through the C module `native/logprob_json.c` when `make` has built it: it writes the position
from those bytes, each value's text by its own repr of the widened FP32 value
(`native/float_text.h`), without a Python number made on the way (7.9 us a K=20 position in
Python, 1.4 us there). The Python path stays for the rest and for a server without the module.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import os
import sysconfig
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import msgspec

from adapters.http import wire_json
from domain.common.wire import REPR_FIXED_FROM, JsonText
from domain.emission.outputs import LogprobEntry
from domain.logprobs.values import LOGPROB_FLOOR, LogprobOptions, wire_logprob
from domain.presentation.logprobs import TokenRendering, shown_alternatives

# Plain msgspec, no hook: used only where its text is the wire's (`value_texts`).
_encode = msgspec.json.Encoder().encode


def value_texts(values: Sequence[float]) -> list[bytes]:
    """Each logprob's text on the wire, as `wire_json.encode(wire_logprob(value))` writes it.

    From the floor up to -1e-4 msgspec writes the digits `repr` writes (the wire's text) and
    formats a whole position in one call, where `repr` costs about a microsecond a value; NaN
    and infinities (msgspec's `null`) and values outside that range take `wire_logprob`.
    """
    text = _encode(values)
    if b"n" not in text and min(values) >= LOGPROB_FLOOR and max(values) <= -REPR_FIXED_FROM:
        return text[1:-1].split(b",")
    return [wire_json.encode(wire_logprob(value)) for value in values]


NATIVE_STEM = Path(__file__).with_name("native") / "_logprob_json"
SWITCH = "HELIOS_NATIVE_JSON"  # "0" keeps every position on the Python path
# packed_position(templates by ID, chosen ID, chosen value, packed pairs, pairs shown)
# -> the position's JSON, or None
PackedPosition = Callable[[list[bytes | None], int, float, bytes, int], bytes | None]


@functools.cache
def native_module() -> ModuleType | None:
    """The C module, or None when the environment sets `SWITCH` to "0" or `make` has not built
    it (loaded on first use, not at import)."""
    path = NATIVE_STEM.with_name(NATIVE_STEM.name + str(sysconfig.get_config_var("EXT_SUFFIX")))
    if os.environ.get(SWITCH, "1") == "0" or not path.is_file():
        return None
    loader = importlib.machinery.ExtensionFileLoader(NATIVE_STEM.name, str(path))
    spec = importlib.util.spec_from_loader(NATIVE_STEM.name, loader)
    if spec is None:
        return None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def native_packed_position() -> PackedPosition | None:
    """The C module's `packed_position`, or None without the module."""
    module = native_module()
    return None if module is None else module.packed_position


def _template(value: object) -> bytes:
    """`value`'s JSON with `%` doubled, to sit in a `%`-format template."""
    return wire_json.encode(value).replace(b"%", b"%%")


class _Memo(dict[int, bytes]):
    """Per token ID bytes, made by `make` on first use; `by_id` holds them too, at their ID
    (None where none is made yet), for the C module to index without an int object."""

    def __init__(self, make: Callable[[int], bytes]) -> None:
        super().__init__()
        self._make = make
        self.by_id: list[bytes | None] = []

    def __missing__(self, token_id: int) -> bytes:
        made = self[token_id] = self._make(token_id)
        if token_id >= len(self.by_id):
            self.by_id.extend([None] * (token_id + 1 - len(self.by_id)))
        self.by_id[token_id] = made
        return made


class LogprobJson:
    """Writes chat choices' `logprobs` objects for one `TokenRendering`, memoizing each token's
    JSON template for the server's life (at most one entry a vocabulary token).

    Completions keep presentation's objects: their `top_logprobs` is one dict of names, which
    msgspec writes faster than templates were (11 against 18 us of CPU a K=20 token, measured).
    """

    def __init__(self, rendering: TokenRendering, *, native: bool = True) -> None:
        """`native=False` keeps every position on the Python path (tests compare the two)."""
        self._packed_position = native_packed_position() if native else None
        text, byte_list = rendering.text, rendering.byte_list
        # b',{"token":<name>,"logprob":%b,"bytes":<list>}'
        self._chat = _Memo(
            lambda i: (
                b',{"token":%b,"logprob":%%b,"bytes":%b}'
                % (_template(text(i)), _template(byte_list(i)))
            )
        )

    def chat(self, entries: Sequence[LogprobEntry], options: LogprobOptions) -> JsonText:
        """`chat_logprobs(entries, options, rendering)` as JSON text."""
        chat, packed_position = self._chat, self._packed_position
        items = []
        for entry in entries:
            chosen = entry.position.chosen
            packed = entry.position.packed
            if packed_position is not None and packed is not None:
                # None where a value is outside repr's range or a token has no template yet,
                # which the Python path below then adds.
                pairs = len(packed) >> 3
                shown = pairs if options.selects else min(options.top_k, pairs)
                made = packed_position(chat.by_id, chosen.token_id, chosen.logprob, packed, shown)
                if made is not None:
                    items.append(made)
                    continue
            ids, values = shown_alternatives(entry, options)
            tops = b"".join(map(chat.__getitem__, ids))[1:]
            template = b'%b,"top_logprobs":[%b]}' % (chat[chosen.token_id][1:-1], tops)
            items.append(template % tuple(value_texts((chosen.logprob, *values))))
        return JsonText(b'{"content":[%b]}' % b",".join(items))
