"""The tokenizer.json and tokenizer_config.json that a GGUF file's vocabulary metadata describes."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from adapters.gpu.loading.gguf_metadata import field as _field

# llama.cpp's token_type values (gguf.TokenType).
_NORMAL = 1
_UNKNOWN = 2
_CONTROL = 3
_USER_DEFINED = 4

# The split patterns llama.cpp applies before byte-level BPE, by `tokenizer.ggml.pre`. GPT-2's
# own pattern is the ByteLevel pre-tokenizer's built-in one.
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Llama 3's pattern differs from Qwen2's only in grouping up to three digits.
_LLAMA3_SPLIT = _QWEN2_SPLIT.replace(r"|\p{N}|", r"|\p{N}{1,3}|")
_SPLITS = {
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
}
_BYTE_LEVEL_PRE_TOKENIZERS = ("default", "gpt2", "smollm", *_SPLITS)
# llama.cpp adds BOS for these unless the file says otherwise (and for every SentencePiece
# vocabulary); their BPE also takes a word found whole in the vocabulary without merging.
_LLAMA3_PRE_TOKENIZERS = frozenset({"llama-bpe", "llama3", "llama-v3"})
# llama.cpp's Gemma converters write add_space_prefix false; a Gemma file without the key
# means the same.
_NO_SPACE_PREFIX_ARCHITECTURES = frozenset({"gemma", "gemma2", "gemma3"})
# Phi-3's control tokens swallow the whitespace after them (rstrip in its tokenizer.json, and
# llama.cpp's Phi-3 rule), except these three.
_PHI3_UNSTRIPPED = frozenset({"<unk>", "<s>", "<|endoftext|>"})
_SPACE_MARK = "\u2581"


def tokenizer_json(reader: Any, gguf_path: Path) -> str:
    """The `tokenizers` serialization of the vocabulary in `reader`'s metadata.

    Raises ValueError naming `gguf_path` for a tokenizer model or pre-tokenizer this module
    does not build, or for inconsistent vocabulary arrays.
    """
    kind = _field(reader, "tokenizer.ggml.model")
    tokens: list[str] = _field(reader, "tokenizer.ggml.tokens")
    token_types: list[int] = _field(reader, "tokenizer.ggml.token_type", None) or []
    if token_types and len(token_types) != len(tokens):
        raise ValueError(
            f"{gguf_path.name}: {len(token_types)} token types for {len(tokens)} tokens"
        )
    types = token_types or [_NORMAL] * len(tokens)
    if kind == "gpt2":
        tokenizer = _byte_level(reader, tokens, gguf_path)
    elif kind == "llama":
        tokenizer = _sentencepiece(reader, tokens, types, gguf_path)
    else:
        raise ValueError(
            f"{gguf_path.name}: tokenizer model {kind!r} is not supported (supported: gpt2, llama)"
        )
    _add_vocabulary_tokens(tokenizer, tokens, types, _architecture(reader))
    return str(tokenizer.to_str(pretty=False))


def tokenizer_config(reader: Any, model_max_length: int) -> dict[str, Any]:
    """tokenizer_config.json: BOS/EOS flags as llama.cpp reads them, special tokens, template."""
    tokens = _field(reader, "tokenizer.ggml.tokens")
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", _adds_bos(reader))),
        "add_eos_token": bool(_field(reader, "tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
    }
    for role, key in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding")):
        token_id = _field(reader, f"tokenizer.ggml.{key}_token_id", None)
        if token_id is not None and 0 <= int(token_id) < len(tokens):
            config[f"{role}_token"] = tokens[int(token_id)]
    template = _field(reader, "tokenizer.chat_template", None)
    if template:
        config["chat_template"] = template
    return config


def _architecture(reader: Any) -> str:
    return str(_field(reader, "general.architecture", ""))


def _adds_bos(reader: Any) -> bool:
    """llama.cpp's default where the file has no add_bos_token key."""
    if _field(reader, "tokenizer.ggml.model", None) == "llama":
        return True
    return _field(reader, "tokenizer.ggml.pre", "default") in _LLAMA3_PRE_TOKENIZERS


def _byte_level(reader: Any, tokens: list[str], gguf_path: Path) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    pre = _field(reader, "tokenizer.ggml.pre", "default")
    if pre not in _BYTE_LEVEL_PRE_TOKENIZERS:
        raise ValueError(
            f"{gguf_path.name}: pre-tokenizer {pre!r} is not supported "
            f"(supported: {', '.join(_BYTE_LEVEL_PRE_TOKENIZERS)})"
        )
    stored_merges = _field(reader, "tokenizer.ggml.merges", None)
    if stored_merges is None:
        raise ValueError(f"{gguf_path.name}: a gpt2 tokenizer needs tokenizer.ggml.merges")
    vocab = {piece: token_id for token_id, piece in enumerate(tokens)}
    merges = _merge_pairs(stored_merges)
    model = models.BPE(vocab=vocab, merges=merges, ignore_merges=pre in _LLAMA3_PRE_TOKENIZERS)
    tokenizer = Tokenizer(model)
    split = _SPLITS.get(pre)
    if split is not None:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    elif pre == "smollm":
        # llama.cpp's smollm pre-tokenizer isolates every digit before the GPT-2 split.
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _sentencepiece(reader: Any, tokens: list[str], types: list[int], gguf_path: Path) -> Any:
    """SentencePiece BPE as llama.cpp runs it: spaces become U+2581 (one prepended where
    add_space_prefix says), pieces merge best score first, unknown characters fall back to
    their `<0xNN>` byte tokens."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    scores: list[float] = _field(reader, "tokenizer.ggml.scores", None) or []
    if scores and len(scores) != len(tokens):
        raise ValueError(f"{gguf_path.name}: {len(scores)} token scores for {len(tokens)} tokens")
    stored_merges = _field(reader, "tokenizer.ggml.merges", None)
    vocab = {piece: token_id for token_id, piece in enumerate(tokens)}
    if stored_merges is not None:
        merges = _merge_pairs(stored_merges)
    elif scores:
        merges = _merges_by_score(tokens, scores, types, vocab)
    else:
        raise ValueError(f"{gguf_path.name}: a llama tokenizer needs token scores or merges")
    unknown_id = _field(reader, "tokenizer.ggml.unknown_token_id", None)
    in_range = unknown_id is not None and 0 <= int(unknown_id) < len(tokens)
    unknown = tokens[int(unknown_id)] if in_range else None
    tokenizer = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token=unknown, fuse_unk=True, byte_fallback=True)
    )
    no_prefix = _architecture(reader) in _NO_SPACE_PREFIX_ARCHITECTURES
    space_prefix = bool(_field(reader, "tokenizer.ggml.add_space_prefix", not no_prefix))
    escape = normalizers.Replace(" ", _SPACE_MARK)
    steps: list[Any] = [
        decoders.Replace(_SPACE_MARK, " "),
        decoders.ByteFallback(),
        decoders.Fuse(),
    ]
    if space_prefix:
        # A normalizer, not Metaspace: like llama.cpp it prefixes every text piece, also one
        # right after a special token, and also text that already starts with a space.
        tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend(_SPACE_MARK), escape])
        steps.append(decoders.Strip(" ", 1, 0))
    else:
        tokenizer.normalizer = escape
    tokenizer.decoder = decoders.Sequence(steps)
    return tokenizer


def _merges_by_score(
    tokens: Sequence[str], scores: Sequence[float], types: Sequence[int], vocab: dict[str, int]
) -> list[tuple[str, str]]:
    """Every split of a normal token into two vocabulary pieces, best-scored token first:
    BPE applying these in order merges as SentencePiece's highest-score-first loop does."""
    ranked = []
    for token_id, piece in enumerate(tokens):
        if types[token_id] != _NORMAL or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((-scores[token_id], token_id, cut, left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _add_vocabulary_tokens(
    tokenizer: Any, tokens: list[str], types: list[int], architecture: str
) -> None:
    """Control and unknown tokens become special added tokens, user-defined ones plain added
    tokens: llama.cpp matches both whole in the text before any merging."""
    from tokenizers import AddedToken

    specials = []
    for piece, kind in zip(tokens, types, strict=True):
        if kind in (_CONTROL, _UNKNOWN):
            strip = architecture == "phi3" and piece not in _PHI3_UNSTRIPPED
            specials.append(AddedToken(piece, special=True, normalized=False, rstrip=strip))
    user_defined = [p for p, kind in zip(tokens, types, strict=True) if kind == _USER_DEFINED]
    # These pieces are already in the vocabulary, so adding them keeps their IDs.
    tokenizer.add_special_tokens(specials)
    tokenizer.add_tokens([AddedToken(p, special=False, normalized=False) for p in user_defined])


def _merge_pairs(merges: Iterable[str]) -> list[tuple[str, str]]:
    pairs = []
    for merge in merges:
        parts = merge.split(" ")
        if len(parts) != 2:
            raise ValueError(f"GGUF merge {merge!r} is not two pieces separated by one space")
        pairs.append((parts[0], parts[1]))
    return pairs
