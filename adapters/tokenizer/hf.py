"""The Tokenizer port over a Hugging Face `tokenizer.json` and its `tokenizer_config.json`."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from adapters.tokenizer.chat_template import render_chat_template

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
# Texts this long are encoded with the GIL released; shorter ones are not worth the batch call.
_LONG_TEXT = 4096


def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte alphabet read backwards: the character spelling each byte, to that byte.

    Printable Latin-1 bytes spell themselves; the rest are moved, in byte order, to the
    code points from 256 on, so every byte has a visible one-character spelling.
    """
    printable = {
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    }
    alphabet: dict[str, int] = {}
    moved = 0
    for byte in range(256):
        if byte in printable:
            alphabet[chr(byte)] = byte
        else:
            alphabet[chr(256 + moved)] = byte
            moved += 1
    return alphabet


class HfTokenizer:
    """A `ports.tokenizer.Tokenizer` backed by the `tokenizers` library."""

    __slots__ = (
        "_add_bos",
        "_add_eos",
        "_bos_token",
        "_bos_token_id",
        "_chat_template",
        "_eos_token",
        "_eos_token_ids",
        "_special_token_ids",
        "_strips_leading_space",
        "_token_bytes",
        "_tokenizer",
    )

    def __init__(
        self,
        tokenizer: Any,
        tokenizer_config: Mapping[str, Any],
        generation_config: Mapping[str, Any],
        chat_template: str | None,
    ) -> None:
        self._tokenizer = tokenizer
        spec = json.loads(tokenizer.to_str())
        decoders = _flatten_decoders(spec.get("decoder"))
        added = tokenizer.get_added_tokens_decoder()
        self._token_bytes = _token_bytes_table(tokenizer.get_vocab(True), added, spec, decoders)
        self._special_token_ids = frozenset(i for i, token in added.items() if token.special)
        self._strips_leading_space = _decoder_strips_leading_space(decoders)
        self._bos_token = _token_content(tokenizer_config.get("bos_token"))
        self._eos_token = _token_content(tokenizer_config.get("eos_token"))
        self._bos_token_id = self._known_id(self._bos_token)
        if self._bos_token_id is None:
            self._bos_token_id = _first_id(generation_config.get("bos_token_id"))
        self._eos_token_ids = frozenset(self._eos_ids(generation_config))
        # When the config is silent, the tokenizer.json post-processor decides (Llama-3 style).
        self._add_bos = tokenizer_config.get("add_bos_token")
        self._add_eos = tokenizer_config.get("add_eos_token")
        self._chat_template = chat_template

    @classmethod
    def from_dir(cls, model_dir: Path) -> HfTokenizer:
        """Load `tokenizer.json` plus the optional config files from a model directory.

        Raises what `read_tokenizer_files` raises."""
        return cls(*read_tokenizer_files(model_dir))

    @property
    def vocab_size(self) -> int:
        return len(self._token_bytes)

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos_token_ids

    @property
    def bos_token_id(self) -> int | None:
        return self._bos_token_id

    @property
    def special_token_ids(self) -> frozenset[int]:
        return self._special_token_ids

    @property
    def strips_leading_space(self) -> bool:
        return self._strips_leading_space

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        if self._add_bos is None and self._add_eos is None:
            return self._encode(text, add_special_tokens)
        token_ids = self._encode(text, False)
        if add_special_tokens and self._add_bos and self._bos_token_id is not None:
            token_ids.insert(0, self._bos_token_id)
        eos_id = self._known_id(self._eos_token)
        if add_special_tokens and self._add_eos and eos_id is not None:
            token_ids.append(eos_id)
        return token_ids

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        if len(text) < _LONG_TEXT:
            return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)
        # The batch call releases the GIL while it works: a long text (a grammar compile's
        # forced output, a huge prompt) leaves the engine and the event loop running.
        (encoding,) = self._tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)
        return list(encoding.ids)

    def token_bytes(self, token_id: int) -> bytes:
        # A negative index would silently wrap to the end of the table.
        if not 0 <= token_id < len(self._token_bytes):
            raise ValueError(f"token_id {token_id} is outside the vocabulary")
        return self._token_bytes[token_id]

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, object]],
        *,
        add_generation_prompt: bool = True,
    ) -> str:
        if self._chat_template is None:
            raise ValueError("this model has no chat template; send a plain completion instead")
        return render_chat_template(
            self._chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self._bos_token,
            eos_token=self._eos_token,
        )

    def _known_id(self, content: str | None) -> int | None:
        if content is None:
            return None
        return self._tokenizer.token_to_id(content)

    def _eos_ids(self, generation_config: Mapping[str, Any]) -> list[int]:
        eos_ids = []
        named = self._known_id(self._eos_token)
        if named is not None:
            eos_ids.append(named)
        configured = generation_config.get("eos_token_id")
        if isinstance(configured, int):
            eos_ids.append(configured)
        elif isinstance(configured, list):
            eos_ids.extend(token_id for token_id in configured if isinstance(token_id, int))
        return eos_ids


def read_tokenizer_files(model_dir: Path) -> tuple[Any, dict[str, Any], dict[str, Any], str | None]:
    """The parsed tokenizer files of a model directory: the `tokenizers` Tokenizer, the
    tokenizer and generation configs (empty where absent) and the chat template (None where
    there is none). A start-up check reads them alone: they are most of a load's cost.

    Raises FileNotFoundError (no tokenizer.json) or ValueError (a file that does not parse, or
    an unreadable one), each naming the file."""
    from tokenizers import Tokenizer

    model_dir = Path(model_dir)
    tokenizer_file = model_dir / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise FileNotFoundError(f"{model_dir} has no tokenizer.json")
    tokenizer_config = _read_json(model_dir / "tokenizer_config.json")
    generation_config = _read_json(model_dir / "generation_config.json")
    template = _pick_template(tokenizer_config.get("chat_template"))
    template_file = model_dir / "chat_template.jinja"
    if template is None and template_file.is_file():
        template = _read_text(template_file)
    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
    except Exception as error:  # the tokenizers library raises a plain Exception
        raise ValueError(f"{tokenizer_file} is not a readable tokenizer: {error}") from None
    return tokenizer, tokenizer_config, generation_config, template


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        payload = json.loads(_read_text(path))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(payload, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return payload


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path} is not UTF-8 text: {error}") from None
    except OSError as error:
        raise ValueError(f"{path} cannot be read: {error.strerror or error}") from None


def _pick_template(configured: object) -> str | None:
    if isinstance(configured, str):
        return configured
    # Some configs list named templates; the unnamed use is the one called "default".
    if isinstance(configured, list):
        for entry in configured:
            if isinstance(entry, dict) and entry.get("name") == "default":
                return entry.get("template")
    return None


def _token_content(token: object) -> str | None:
    if isinstance(token, str):
        return token
    if isinstance(token, dict) and isinstance(token.get("content"), str):
        return token["content"]
    return None


def _first_id(configured: object) -> int | None:
    if isinstance(configured, int):
        return configured
    if isinstance(configured, list) and configured and isinstance(configured[0], int):
        return configured[0]
    return None


def _flatten_decoders(decoder: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    if not decoder:
        return []
    if decoder.get("type") == "Sequence":
        return [step for inner in decoder.get("decoders", []) for step in _flatten_decoders(inner)]
    return [decoder]


def _decoder_strips_leading_space(decoders: list[Mapping[str, Any]]) -> bool:
    for decoder in decoders:
        kind = decoder.get("type")
        if kind == "Strip" and decoder.get("content") == " " and decoder.get("start", 0) > 0:
            return True
        if kind == "Metaspace":
            scheme = decoder.get("prepend_scheme")
            if scheme is not None:
                return scheme != "never"
            return bool(decoder.get("add_prefix_space", True))
    return False


def _token_bytes_table(
    vocab: Mapping[str, int],
    added: Mapping[int, Any],
    spec: Mapping[str, Any],
    decoders: list[Mapping[str, Any]],
) -> list[bytes]:
    kinds = {decoder.get("type") for decoder in decoders}
    byte_fallback = "ByteFallback" in kinds or bool(spec.get("model", {}).get("byte_fallback"))
    replacements = _piece_replacements(decoders)
    alphabet = byte_level_alphabet() if "ByteLevel" in kinds else None
    size = 1 + max([*vocab.values(), *added.keys()], default=-1)
    table = [b""] * size
    for piece, token_id in vocab.items():
        table[token_id] = _piece_bytes(piece, alphabet, byte_fallback, replacements)
    # The decoder emits added tokens verbatim, whatever the model's piece spelling.
    for token_id, token in added.items():
        table[token_id] = token.content.encode("utf-8")
    return table


def _piece_replacements(decoders: list[Mapping[str, Any]]) -> list[tuple[str, str]]:
    replacements = []
    for decoder in decoders:
        if decoder.get("type") == "Metaspace":
            replacements.append((decoder.get("replacement", "▁"), " "))
        elif decoder.get("type") == "Replace":
            pattern = decoder.get("pattern", {})
            if "String" in pattern:
                replacements.append((pattern["String"], decoder.get("content", "")))
    return replacements


def _piece_bytes(
    piece: str,
    alphabet: Mapping[str, int] | None,
    byte_fallback: bool,
    replacements: list[tuple[str, str]],
) -> bytes:
    if alphabet is not None:
        # Like the ByteLevel decoder, a character outside the alphabet stands for its UTF-8.
        return b"".join(
            bytes((alphabet[char],)) if char in alphabet else char.encode("utf-8") for char in piece
        )
    if byte_fallback:
        match = _BYTE_PIECE.fullmatch(piece)
        if match is not None:
            return bytes((int(match.group(1), 16),))
    for old, new in replacements:
        piece = piece.replace(old, new)
    return piece.encode("utf-8")
