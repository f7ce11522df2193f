"""The tokenizer port: text to token IDs, token IDs to exact bytes, chat templates."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol


class Tokenizer(Protocol):
    """Turns text into token IDs and token IDs into their exact raw bytes.

    Invariants an implementation keeps:
    - `token_bytes(t)` is the token's raw byte string as the tokenizer's decoder produces it
      before any UTF-8 replacement: byte-level BPE pieces map through the byte alphabet,
      byte-fallback pieces such as `<0xE2>` give that single byte, `▁` gives a space.
      Special tokens give their literal content encoded as UTF-8.
    - `vocab_size` counts every ID the model can emit (the tokenizer's vocabulary, added
      tokens included); IDs at or above it are invalid.
    - `special_token_ids` are the IDs removed from text when `skip_special_tokens` is on.
    """

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_token_ids(self) -> frozenset[int]: ...

    @property
    def bos_token_id(self) -> int | None: ...

    @property
    def special_token_ids(self) -> frozenset[int]: ...

    @property
    def strips_leading_space(self) -> bool:
        """True when decoding drops one leading space of the first token (SentencePiece)."""
        ...

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]: ...

    def token_bytes(self, token_id: int) -> bytes: ...

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str: ...

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, object]],
        *,
        add_generation_prompt: bool = True,
    ) -> str: ...
