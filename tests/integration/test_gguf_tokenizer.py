"""GGUF vocabularies as llama.cpp writes them, exported and checked against transformers."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from adapters.gpu.loading.gguf_tokenizer import tokenizer_config, tokenizer_json
from adapters.tokenizer.hf import HfTokenizer
from tests.support.gguf_vocab import (
    BYTE,
    NORMAL,
    PHI3_CONTROL,
    PHI3_TEMPLATE,
    SPM_CONTROL,
    GgufVocabulary,
    byte_level_vocabulary,
    sentencepiece_vocabulary,
    write_vocabulary_gguf,
)
from tests.support.tokenizers import build_byte_level_bpe

VOCAB = 320
TEXTS = [
    "Hello, world! How are you today?",
    "Numbers 1234567 and 3.14159, the year 2024.",
    "def square(x):\n    return x ** 2  # comment\n\n\n",
    "café naïve 日本語 Привет 🎉🚀👍🏽",
    "  leading spaces,\ttabs and\n\nblank lines  ",
    "I'm sure you'RE right, they'll SEE.",
    "x  y   z",
    " ",
    "",
]
# Special and user-defined tokens inside text; none followed by whitespace (see the Phi-3 test).
SPECIAL_TEXTS = ["<s>hi</s>there<s>x", "a<tool>b<tool>c", "<|im_start|>user\nhi<|im_end|>"]
PHI3_SPECIAL_TEXTS = ["<s>hi</s>there<|user|>x<|end|>", "a<tool>b<tool>c"]


@pytest.fixture(scope="module")
def byte_level_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("byte-level")
    build_byte_level_bpe(directory, vocab_size=VOCAB)
    return directory


def _gguf(directory: Path, architecture: str, vocabulary: GgufVocabulary) -> Path:
    name = f"{architecture}-{vocabulary.model}-{vocabulary.pre}.gguf"
    return write_vocabulary_gguf(directory / name, architecture, vocabulary)


def _ours(gguf_path: Path) -> HfTokenizer:
    """Our tokenizer.json and tokenizer_config.json of the file, loaded as the server does."""
    import gguf

    reader = gguf.GGUFReader(gguf_path)
    directory = gguf_path.with_suffix(".exported")
    directory.mkdir()
    (directory / "tokenizer.json").write_text(tokenizer_json(reader, gguf_path), encoding="utf-8")
    config = tokenizer_config(reader, 512)
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return HfTokenizer.from_dir(directory)


def _reference(gguf_path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)


def _assert_encodes_like(ours: HfTokenizer, reference: Any, texts: list[str]) -> None:
    for text in texts:
        expected = reference.encode(text)
        assert ours.encode(text) == expected, text
        assert ours.decode(expected, skip_special_tokens=False) == reference.decode(
            expected, skip_special_tokens=False
        )


@pytest.mark.parametrize(("architecture", "pre"), [("qwen3", "qwen2"), ("llama", "llama-bpe")])
def test_byte_level_pre_tokenizers_encode_like_transformers_gguf_tokenizer(
    byte_level_dir: Path, tmp_path: Path, architecture: str, pre: str
) -> None:
    path = _gguf(tmp_path, architecture, byte_level_vocabulary(byte_level_dir, pre))

    ours = _ours(path)

    _assert_encodes_like(ours, _reference(path), TEXTS + SPECIAL_TEXTS)
    for text in TEXTS:
        assert ours.decode(ours.encode(text), skip_special_tokens=False) == text


def test_qwen2_isolates_digits_and_llama3_groups_them_by_three(
    byte_level_dir: Path, tmp_path: Path
) -> None:
    import gguf
    from tokenizers import Tokenizer

    splits = {}
    for pre in ("qwen2", "llama-bpe", "default"):
        path = _gguf(tmp_path, "llama", byte_level_vocabulary(byte_level_dir, pre))
        tokenizer = Tokenizer.from_str(tokenizer_json(gguf.GGUFReader(path), path))
        pieces = tokenizer.pre_tokenizer.pre_tokenize_str("in 1234567\n\n  it's")
        splits[pre] = [piece for piece, _ in pieces]

    assert splits["qwen2"][:9] == ["in", "Ġ", "1", "2", "3", "4", "5", "6", "7"]
    assert splits["llama-bpe"][:5] == ["in", "Ġ", "123", "456", "7"]
    assert splits["default"][:2] == ["in", "Ġ1234567"]
    assert splits["qwen2"][-4:] == splits["llama-bpe"][-4:] == ["ĊĊ", "Ġ", "Ġit", "'s"]


def test_llama3_takes_a_word_found_whole_in_the_vocabulary_without_merging(
    tmp_path: Path,
) -> None:
    from tokenizers import pre_tokenizers

    tokens = (*sorted(pre_tokenizers.ByteLevel.alphabet()), "ab", "abc")
    vocabulary = GgufVocabulary(
        model="gpt2",
        tokens=tokens,
        token_types=(NORMAL,) * len(tokens),
        # "abc" is in the vocabulary, but no merge builds it from "ab" and "c".
        merges=("a b",),
        flags={"add_bos_token": False},
    )
    encoded = {}
    for pre in ("llama-bpe", "qwen2"):
        path = _gguf(tmp_path, "llama", replace(vocabulary, pre=pre))
        encoded[pre] = _ours(path).encode("abc")

    assert encoded["llama-bpe"] == [tokens.index("abc")]
    assert encoded["qwen2"] == [tokens.index("ab"), tokens.index("c")]


@pytest.mark.parametrize(
    ("architecture", "controls", "texts"),
    [
        ("phi3", SPM_CONTROL + PHI3_CONTROL, TEXTS + PHI3_SPECIAL_TEXTS),
        ("gemma3", SPM_CONTROL, TEXTS + SPECIAL_TEXTS[:2]),
    ],
)
def test_sentencepiece_vocabularies_encode_like_transformers_gguf_tokenizer(
    tmp_path: Path, architecture: str, controls: tuple[str, ...], texts: list[str]
) -> None:
    space_prefix = False if architecture == "gemma3" else None
    vocabulary = sentencepiece_vocabulary(VOCAB, controls=controls, add_space_prefix=space_prefix)
    path = _gguf(tmp_path, architecture, vocabulary)

    ours = _ours(path)

    _assert_encodes_like(ours, _reference(path), texts)
    assert ours.vocab_size == VOCAB
    assert ours.bos_token_id == 1
    assert ours.eos_token_ids == frozenset({2})
    assert ours.special_token_ids == frozenset(range(len(controls)))
    # Characters outside the small trained alphabet (CJK, emoji) fall back to byte tokens.
    encoded = ours.encode("日本🎉", add_special_tokens=False)
    assert all(vocabulary.token_types[token_id] == BYTE for token_id in encoded[1:])
    prefix = b"" if architecture == "gemma3" else b" "
    assert ours.strips_leading_space is (architecture != "gemma3")
    for text in TEXTS:
        pieces = ours.encode(text, add_special_tokens=False)
        assert b"".join(ours.token_bytes(t) for t in pieces) == (
            prefix + text.encode() if text else b""
        )
        assert ours.decode(pieces) == text


def test_a_llama_sentencepiece_vocabulary_prefixes_every_text_piece_as_llama_cpp_does(
    tmp_path: Path,
) -> None:
    vocabulary = sentencepiece_vocabulary(VOCAB)
    ours = _ours(_gguf(tmp_path, "llama", vocabulary))

    def pieces(text: str) -> list[str]:
        return [vocabulary.tokens[t] for t in ours.encode(text, add_special_tokens=False)]

    # llama.cpp puts one space before the text, and again after each special token, even
    # where the text starts with a space; transformers' GGUF loader prefixes the first only.
    assert pieces(" ") == ["▁", "▁"]
    assert pieces("y")[0].startswith("▁")
    assert pieces("x<s>y") == [*pieces("x"), "<s>", *pieces("y")]
    assert pieces("<tool>b") == ["<tool>", *pieces("b")]
    assert ours.encode("hi")[0] == 1
    assert ours.decode(ours.encode(" hi there"), skip_special_tokens=True) == " hi there"


def test_merges_stored_in_a_llama_file_are_used_instead_of_the_scores(tmp_path: Path) -> None:
    scored = sentencepiece_vocabulary(VOCAB, add_space_prefix=False)
    tokens = scored.tokens
    longest = max(tokens[-50:], key=len)
    word = longest.replace("▁", " ")
    # Scores alone merge up to the longest piece; the stored merges allow one pair only.
    stored = _ours(_gguf(tmp_path, "llama", replace(scored, merges=("▁ t",))))
    by_score = _ours(_gguf(tmp_path, "gemma3", scored))

    assert len(longest) > 2
    assert by_score.encode(word, add_special_tokens=False) == [tokens.index(longest)]
    assert stored.encode(" t t", add_special_tokens=False) == [tokens.index("▁t")] * 2
    assert len(stored.encode(word, add_special_tokens=False)) == len(longest) - longest.count("▁t")


def test_phi3_control_tokens_swallow_the_whitespace_after_them(tmp_path: Path) -> None:
    vocabulary = sentencepiece_vocabulary(
        VOCAB, controls=SPM_CONTROL + PHI3_CONTROL, chat_template=PHI3_TEMPLATE
    )
    path = _gguf(tmp_path, "phi3", vocabulary)
    ours = _ours(path)
    reference = _reference(path)
    messages = [{"role": "user", "content": "hi"}]

    rendered = ours.apply_chat_template(messages)
    encoded = ours.encode(rendered, add_special_tokens=False)

    assert rendered == reference.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    # Phi-3's tokenizer.json and llama.cpp strip the newline after <|user|> and <|end|>.
    assert [vocabulary.tokens[t] for t in encoded] == [
        "<|user|>",
        *[vocabulary.tokens[t] for t in reference.encode("hi", add_special_tokens=False)],
        "<|end|>",
        "<|assistant|>",
    ]
    # <s>, <unk> and <|endoftext|> keep it.
    assert ours.encode("<s>\nx", add_special_tokens=False)[1:2] == [vocabulary.tokens.index("▁")]


def test_tokenizer_config_reads_bos_eos_and_space_flags_with_llama_cpp_defaults(
    byte_level_dir: Path, tmp_path: Path
) -> None:
    import gguf

    silent = replace(sentencepiece_vocabulary(VOCAB), flags={})
    spm = _gguf(tmp_path, "gemma3", silent)
    bpe_vocabulary = byte_level_vocabulary(byte_level_dir, "llama-bpe")
    bpe = _gguf(tmp_path, "llama", replace(bpe_vocabulary, flags={}))

    spm_config = tokenizer_config(gguf.GGUFReader(spm), 512)
    bpe_config = tokenizer_config(gguf.GGUFReader(bpe), 512)
    gemma = _ours(spm)

    # Without the keys llama.cpp adds BOS for SentencePiece and Llama 3 vocabularies.
    assert (spm_config["add_bos_token"], spm_config["add_eos_token"]) == (True, False)
    assert bpe_config["add_bos_token"] is True
    assert (spm_config["bos_token"], spm_config["eos_token"], spm_config["unk_token"]) == (
        "<s>",
        "</s>",
        "<unk>",
    )
    # A Gemma file without add_space_prefix means no prefix, as llama.cpp's converter writes.
    assert not gemma.strips_leading_space
    assert gemma.encode("hi")[0] == 1


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"model": "rwkv"}, "tiny.gguf: tokenizer model 'rwkv' is not supported"),
        ({"pre": "falcon"}, "tiny.gguf: pre-tokenizer 'falcon' is not supported"),
    ],
)
def test_an_unknown_tokenizer_model_or_pre_tokenizer_names_the_file_and_the_value(
    byte_level_dir: Path, tmp_path: Path, keys: dict[str, str], message: str
) -> None:
    import gguf

    vocabulary = byte_level_vocabulary(byte_level_dir, "qwen2")
    path = write_vocabulary_gguf(tmp_path / "tiny.gguf", "qwen3", replace(vocabulary, **keys))

    with pytest.raises(ValueError, match=message) as error:
        tokenizer_json(gguf.GGUFReader(path), path)
    assert "\n" not in str(error.value)
