"""HfTokenizer against tiny trained tokenizers and against transformers on the same files."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.tokenizer.hf import HfTokenizer, byte_level_alphabet
from tests.support.tokenizers import (
    BOS_TOKEN,
    EOS_TOKEN,
    EXTRA_EOS_TOKEN,
    SPECIAL_TOKENS,
    build_byte_fallback,
    build_byte_level_bpe,
    tokenizer_vocab_size,
)

BUILDERS = {"byte_level": build_byte_level_bpe, "byte_fallback": build_byte_fallback}
MULTIBYTE_TEXTS = [
    "café naïve Łódź",
    "日本語のテキスト 東京",
    "emoji 🎉🚀 and flags 🇫🇷 and skin 👍🏽",
    "Привет, Ελλάδα! 한국어",
    "  two leading spaces\nand a newline\ttab",
]
SPECIAL_TEXT = "<s>special</s> inside <|im_end|> text"
CONVERSATIONS = [
    [{"role": "user", "content": "hi"}],
    [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "What is 日本語? 🎉"},
        {"role": "assistant", "content": "A language."},
        {"role": "user", "content": "thanks"},
    ],
]
# ▁ is excluded: SentencePiece-style tokenizers cannot tell it from an encoded space.
PLAIN_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="▁"),
    min_size=1,
    max_size=40,
) | st.sampled_from(MULTIBYTE_TEXTS)
# Text around special tokens is encoded piecewise, so it only joins the comparisons.
TEXT = PLAIN_TEXT | st.just(SPECIAL_TEXT)
EXAMPLES = settings(max_examples=60, deadline=None, derandomize=True)


@dataclass(frozen=True)
class Tiny:
    kind: str
    directory: Path
    ours: HfTokenizer
    reference: Any


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    from transformers import PreTrainedTokenizerFast

    directory = tmp_path_factory.mktemp(request.param)
    BUILDERS[request.param](directory)
    reference = PreTrainedTokenizerFast.from_pretrained(directory)
    return Tiny(request.param, directory, HfTokenizer.from_dir(directory), reference)


def expected_token_bytes(tiny: Tiny, text: str) -> bytes:
    if tiny.kind == "byte_fallback" and not text.startswith(" "):
        # Metaspace puts a ▁ before the first word unless the text already starts with one.
        return b" " + text.encode("utf-8")
    return text.encode("utf-8")


@pytest.mark.model
@EXAMPLES
@given(text=PLAIN_TEXT)
def test_token_bytes_of_an_encoding_concatenate_to_the_utf8_text(tiny: Tiny, text: str) -> None:
    token_ids = tiny.ours.encode(text, add_special_tokens=False)
    joined = b"".join(tiny.ours.token_bytes(token_id) for token_id in token_ids)
    assert joined == expected_token_bytes(tiny, text)


@pytest.mark.model
def test_multibyte_characters_are_split_across_tokens(tiny: Tiny) -> None:
    token_ids = tiny.ours.encode("日本語 🎉", add_special_tokens=False)
    pieces = [tiny.ours.token_bytes(token_id) for token_id in token_ids]

    def is_utf8(piece: bytes) -> bool:
        try:
            piece.decode("utf-8")
        except UnicodeDecodeError:
            return False
        return True

    assert not all(is_utf8(piece) for piece in pieces)


@pytest.mark.model
def test_special_tokens_give_their_literal_content_as_bytes(tiny: Tiny) -> None:
    special_ids = {token: tiny.reference.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS}
    for token, token_id in special_ids.items():
        assert tiny.ours.token_bytes(token_id) == token.encode("utf-8")
    assert tiny.ours.special_token_ids == frozenset(special_ids.values())


def test_byte_fallback_pieces_give_one_byte_and_the_meta_space_gives_a_space(
    tmp_path: Path,
) -> None:
    build_byte_fallback(tmp_path)
    ours = HfTokenizer.from_dir(tmp_path)
    vocab = json.loads((tmp_path / "tokenizer.json").read_text())["model"]["vocab"]
    assert ours.token_bytes(vocab["<0xE2>"]) == b"\xe2"
    assert ours.token_bytes(vocab["<0x0A>"]) == b"\n"
    assert ours.token_bytes(vocab["▁"]) == b" "


def test_byte_level_alphabet_spells_every_byte_with_one_distinct_character() -> None:
    alphabet = byte_level_alphabet()
    assert sorted(alphabet.values()) == list(range(256))
    assert alphabet["Ġ"] == ord(" ")
    assert alphabet["Ċ"] == ord("\n")
    assert alphabet["A"] == ord("A")


@pytest.mark.parametrize("vocab_size", [300, 320])
@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_built_vocabulary_has_exactly_the_requested_size(
    kind: str, vocab_size: int, tmp_path: Path
) -> None:
    BUILDERS[kind](tmp_path, vocab_size=vocab_size)
    assert tokenizer_vocab_size(tmp_path) == vocab_size
    assert HfTokenizer.from_dir(tmp_path).vocab_size == vocab_size


@pytest.mark.model
def test_eos_ids_join_the_config_eos_token_and_generation_config_ids(tiny: Tiny) -> None:
    expected = {tiny.reference.convert_tokens_to_ids(t) for t in (EOS_TOKEN, EXTRA_EOS_TOKEN)}
    assert tiny.ours.eos_token_ids == frozenset(expected)
    assert tiny.ours.bos_token_id == tiny.reference.convert_tokens_to_ids(BOS_TOKEN)


@pytest.mark.model
def test_bos_is_prepended_only_when_the_tokenizer_config_asks(tiny: Tiny) -> None:
    with_specials = tiny.ours.encode("hello")
    without = tiny.ours.encode("hello", add_special_tokens=False)
    if tiny.kind == "byte_fallback":
        assert with_specials == [tiny.ours.bos_token_id, *without]
    else:
        assert with_specials == without


@pytest.mark.model
def test_only_the_byte_fallback_decoder_strips_a_leading_space(tiny: Tiny) -> None:
    assert tiny.ours.strips_leading_space is (tiny.kind == "byte_fallback")
    token_ids = tiny.ours.encode("word", add_special_tokens=False)
    first = tiny.ours.token_bytes(token_ids[0])
    assert first.startswith(b" ") is tiny.ours.strips_leading_space
    assert tiny.ours.decode(token_ids) == "word"


@pytest.mark.model
@EXAMPLES
@given(text=TEXT)
def test_encode_matches_transformers(tiny: Tiny, text: str) -> None:
    for add_special_tokens in (True, False):
        ours = tiny.ours.encode(text, add_special_tokens=add_special_tokens)
        assert ours == tiny.reference.encode(text, add_special_tokens=add_special_tokens)


@pytest.mark.model
@EXAMPLES
@given(text=TEXT)
def test_decode_matches_transformers(tiny: Tiny, text: str) -> None:
    token_ids = tiny.ours.encode(text)
    for skip in (True, False):
        expected = tiny.reference.decode(token_ids, skip_special_tokens=skip)
        assert tiny.ours.decode(token_ids, skip_special_tokens=skip) == expected


@pytest.mark.model
@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_chat_template_renders_like_transformers(
    tiny: Tiny, messages: list[dict[str, str]], add_generation_prompt: bool
) -> None:
    expected = tiny.reference.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    rendered = tiny.ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    assert rendered == expected
    assert rendered.endswith("<|im_start|>assistant\n") is add_generation_prompt


@pytest.mark.model
def test_template_raise_exception_becomes_a_value_error(tiny: Tiny) -> None:
    with pytest.raises(ValueError, match="cannot start with a tool message"):
        tiny.ours.apply_chat_template([{"role": "tool", "content": "42"}])


@pytest.mark.model
def test_missing_chat_template_is_a_clear_value_error(tiny: Tiny, tmp_path: Path) -> None:
    copy = _copy_without_template(tiny.directory, tmp_path)
    with pytest.raises(ValueError, match="no chat template"):
        HfTokenizer.from_dir(copy).apply_chat_template([{"role": "user", "content": "hi"}])


@pytest.mark.model
def test_chat_template_jinja_file_is_used_when_the_config_has_none(
    tiny: Tiny, tmp_path: Path
) -> None:
    copy = _copy_without_template(tiny.directory, tmp_path)
    (copy / "chat_template.jinja").write_text("{{ messages[0]['content'] | upper }}")
    rendered = HfTokenizer.from_dir(copy).apply_chat_template([{"role": "user", "content": "hi"}])
    assert rendered == "HI"


@pytest.mark.model
def test_token_bytes_rejects_ids_outside_the_vocabulary(tiny: Tiny) -> None:
    for token_id in (-1, tiny.ours.vocab_size):
        with pytest.raises(ValueError, match="outside the vocabulary"):
            tiny.ours.token_bytes(token_id)


def test_missing_tokenizer_json_is_reported(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        HfTokenizer.from_dir(tmp_path)


def _copy_without_template(source: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(source, copy)
    config_path = copy / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    del config["chat_template"]
    config_path.write_text(json.dumps(config))
    return copy


@pytest.mark.model
def test_special_token_text_is_one_id_that_keeps_its_bytes(tiny: Tiny) -> None:
    token_ids = tiny.ours.encode(SPECIAL_TEXT, add_special_tokens=False)
    end_id = tiny.reference.convert_tokens_to_ids(EOS_TOKEN)
    assert token_ids.count(end_id) == 1
    joined = b"".join(tiny.ours.token_bytes(token_id) for token_id in token_ids)
    # No ▁ is prepended here: the text starts with a special token, not with a word.
    assert joined == SPECIAL_TEXT.encode("utf-8")
