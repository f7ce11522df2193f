"""Chat `logprobs` objects written as JSON text from per-token templates.

Built as presentation's objects (`chat_logprobs`: a dict and a copied byte list per
alternative) and then encoded, the logprobs of a K=20 chat chunk were the largest host cost of
a K=20 stream (docs/performance.md, issue 21). A token's JSON is fixed per token ID but for its
logprob (`{"token":"x","logprob":%b,"bytes":[120]}`), so it is encoded once per server as a
bytes template; a position joins its tokens' templates and fills in the values' text with one
`%`: a whole K=20 chunk (logprobs, chunk, SSE frame) took 20 us of CPU before and 13 us after,
in process on the 2-core dev box. The bytes equal `wire_json.encode` of presentation's objects
(tests/integration/http/test_logprob_json.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

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


def _template(value: object) -> bytes:
    """`value`'s JSON with `%` doubled, to sit in a `%`-format template."""
    return wire_json.encode(value).replace(b"%", b"%%")


class _Memo(dict[int, bytes]):
    """Per token ID bytes, made by `make` on first use."""

    def __init__(self, make: Callable[[int], bytes]) -> None:
        super().__init__()
        self._make = make

    def __missing__(self, token_id: int) -> bytes:
        made = self[token_id] = self._make(token_id)
        return made


class LogprobJson:
    """Writes chat choices' `logprobs` objects for one `TokenRendering`, memoizing each token's
    JSON template for the server's life (at most one entry a vocabulary token).

    Completions keep presentation's objects: their `top_logprobs` is one dict of names, which
    msgspec writes faster than templates were (11 against 18 us of CPU a K=20 token, measured).
    """

    def __init__(self, rendering: TokenRendering) -> None:
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
        chat = self._chat
        items = []
        for entry in entries:
            chosen = entry.position.chosen
            ids, values = shown_alternatives(entry, options)
            tops = b"".join(map(chat.__getitem__, ids))[1:]
            template = b'%b,"top_logprobs":[%b]}' % (chat[chosen.token_id][1:-1], tops)
            items.append(template % tuple(value_texts((chosen.logprob, *values))))
        return JsonText(b'{"content":[%b]}' % b",".join(items))
