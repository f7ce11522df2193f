"""Tokenizer metadata as llama.cpp writes it into GGUF files: byte-level BPE and SentencePiece."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.tokenizers import (
    BOS_TOKEN,
    BYTE_PIECE_COUNT,
    CHATML_TEMPLATE,
    EOS_TOKEN,
    SPECIAL_TOKENS,
    build_byte_fallback,
)

# gguf.TokenType
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6
SPM_CONTROL = ("<unk>", "<s>", "</s>")
PHI3_CONTROL = ("<|endoftext|>", "<|user|>", "<|assistant|>", "<|end|>")
USER_DEFINED_TOKEN = "<tool>"
PHI3_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@dataclass(frozen=True)
class GgufVocabulary:
    """The tokenizer.ggml.* keys of one file."""

    model: str
    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    scores: tuple[float, ...] = ()
    merges: tuple[str, ...] = ()
    pre: str | None = None
    ids: dict[str, int] = field(default_factory=dict)
    flags: dict[str, bool] = field(default_factory=dict)
    chat_template: str | None = None

    def write_keys(self, writer: Any) -> None:
        writer.add_tokenizer_model(self.model)
        if self.pre is not None:
            writer.add_tokenizer_pre(self.pre)
        writer.add_token_list(list(self.tokens))
        writer.add_token_types(list(self.token_types))
        if self.scores:
            writer.add_token_scores(list(self.scores))
        if self.merges:
            writer.add_token_merges(list(self.merges))
        for role, token_id in self.ids.items():
            getattr(writer, f"add_{role}_token_id")(token_id)
        for flag, value in self.flags.items():
            getattr(writer, f"add_{flag}")(value)
        if self.chat_template is not None:
            writer.add_chat_template(self.chat_template)


def byte_level_vocabulary(model_dir: Path, pre: str) -> GgufVocabulary:
    """The byte-level BPE of `model_dir`'s tokenizer.json (from `build_byte_level_bpe`) under
    pre-tokenizer `pre`, with its BOS and EOS, no BOS added, and the ChatML template."""
    spec = json.loads((Path(model_dir) / "tokenizer.json").read_text(encoding="utf-8"))
    vocab: dict[str, int] = spec["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.__getitem__)
    specials = {added["id"] for added in spec["added_tokens"] if added["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    return GgufVocabulary(
        model="gpt2",
        tokens=tuple(tokens),
        token_types=tuple(CONTROL if i in specials else NORMAL for i in range(len(tokens))),
        merges=tuple(merges),
        pre=pre,
        ids={"bos": vocab[BOS_TOKEN], "eos": vocab[EOS_TOKEN]},
        flags={"add_bos_token": False},
        chat_template=CHATML_TEMPLATE,
    )


def sentencepiece_vocabulary(
    vocab_size: int,
    *,
    controls: tuple[str, ...] = SPM_CONTROL,
    add_space_prefix: bool | None = None,
    chat_template: str | None = None,
) -> GgufVocabulary:
    """A SentencePiece BPE vocabulary of exactly `vocab_size` tokens, laid out as llama.cpp
    writes one: `controls` (the first three being <unk>, <s>, </s>), the 256 `<0xNN>` byte
    tokens, one user-defined token, then trained pieces scored by rank (best first)."""
    reserved = len(controls) + BYTE_PIECE_COUNT + 1
    pieces = _trained_pieces(vocab_size - reserved)
    tokens = [*controls, *(f"<0x{b:02X}>" for b in range(BYTE_PIECE_COUNT)), USER_DEFINED_TOKEN]
    types = [UNKNOWN, *[CONTROL] * (len(controls) - 1), *[BYTE] * BYTE_PIECE_COUNT, USER_DEFINED]
    scores = [0.0] * len(tokens)
    tokens += pieces
    types += [NORMAL] * len(pieces)
    scores += [-float(rank) for rank in range(len(pieces))]
    flags = {"add_bos_token": True, "add_eos_token": False}
    if add_space_prefix is not None:
        flags["add_space_prefix"] = add_space_prefix
    return GgufVocabulary(
        model="llama",
        tokens=tuple(tokens),
        token_types=tuple(types),
        scores=tuple(scores),
        pre="default",
        ids={"unk": 0, "bos": 1, "eos": 2},
        flags=flags,
        chat_template=chat_template,
    )


def write_vocabulary_gguf(path: Path, architecture: str, vocabulary: GgufVocabulary) -> Path:
    """A GGUF of a tiny `architecture` model's metadata and `vocabulary`, without tensors:
    enough for transformers' GGUF tokenizer loading and for our tokenizer export."""
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_context_length(512)
    writer.add_embedding_length(64)
    writer.add_block_count(2)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    if architecture in ("gemma3", "phi3"):
        writer.add_sliding_window(64)
    if architecture == "phi3":
        writer.add_rope_dimension_count(16)
    writer.add_file_type(0)
    vocabulary.write_keys(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _trained_pieces(count: int) -> list[str]:
    """`count` Metaspace pieces (a small alphabet, then merges in training order)."""
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        reserved = len(SPECIAL_TOKENS) + BYTE_PIECE_COUNT
        build_byte_fallback(directory, vocab_size=reserved + count)
        spec = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    vocab: dict[str, int] = spec["model"]["vocab"]
    return [piece for piece in sorted(vocab, key=vocab.__getitem__) if vocab[piece] >= reserved]
