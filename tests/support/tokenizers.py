"""Train tiny byte-level and byte-fallback tokenizers into model directories for tests."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>", "<s>", "</s>")
BOS_TOKEN = "<s>"
EOS_TOKEN = "<|im_end|>"
# generation_config.json lists this one too, so eos_token_ids has two members.
EXTRA_EOS_TOKEN = "</s>"
BYTE_PIECE_COUNT = 256

# Block tags on their own lines and an indented one exercise trim_blocks and lstrip_blocks.
CHATML_TEMPLATE = (
    "{% if messages and messages[0]['role'] == 'tool' %}\n"
    "{{ raise_exception('a conversation cannot start with a tool message') }}\n"
    "{% endif %}\n"
    "{{ bos_token -}}\n"
    "{% for message in messages %}\n"
    "<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}\n"
    "  {% if add_generation_prompt %}\n"
    "<|im_start|>assistant\n"
    "  {% endif %}\n"
)

# Words in several scripts, so multi-byte characters end up split across tokens.
_CORPUS_WORDS = (
    "the quick brown fox jumps over lazy dog while tokens stream from server to client "
    "every request gets its own slot and epoch so nothing stale leaks into a new answer "
    "café naïve über señor façade crème brûlée "
    "Ærø Ångström Łódź Dvořák smörgåsbord "
    "Привет мир Ελλάδα γειά σου 日本語 東京 北京 中文 漢字 한국어 서울 "
    "🎉 🚀 👍🏽 🇫🇷 😀 🤖 ✨ 42 2024 3.14 100% a+b=c (x) [y] {z} <tag> #hash @user"
)


def build_byte_level_bpe(
    directory: Path, *, vocab_size: int = 320, corpus: list[str] | None = None
) -> None:
    """A GPT-2 style byte-level BPE with exactly `vocab_size` IDs, written into `directory`;
    `corpus` (default: the multi-script words) must hold enough distinct text for the merges."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    minimum = len(SPECIAL_TOKENS) + BYTE_PIECE_COUNT + 1
    if vocab_size < minimum:
        raise ValueError(f"a byte-level tokenizer needs vocab_size >= {minimum}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus or _corpus(), trainer)
    _write_model_dir(directory, tokenizer, add_bos_token=False)
    _check_vocab_size(directory, vocab_size)


# Reasoning and tool-call markers, added as Qwen3 adds them: whole tokens that decoding keeps.
MARKER_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>")


def build_marker_bpe(directory: Path, *, vocab_size: int = 320) -> None:
    """`build_byte_level_bpe` plus `MARKER_TOKENS` as added tokens that are not special, so
    they stay in decoded text for the output parsers to find."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    added = [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    added += [AddedToken(t, special=False, normalized=False) for t in MARKER_TOKENS]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=added,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer)
    _write_model_dir(directory, tokenizer, add_bos_token=False)
    # The trainer saves every token it reserves as special; the markers are not.
    path = Path(directory) / "tokenizer.json"
    spec = json.loads(path.read_text(encoding="utf-8"))
    for token in spec["added_tokens"]:
        if token["content"] in MARKER_TOKENS:
            token["special"] = False
    path.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    _check_vocab_size(directory, vocab_size)


def build_byte_fallback(directory: Path, *, vocab_size: int = 320) -> None:
    """A Llama-2 style BPE: Metaspace, `<0x00>`..`<0xFF>` pieces, byte_fallback, BOS added."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    reserved = len(SPECIAL_TOKENS) + BYTE_PIECE_COUNT
    if vocab_size < reserved + 10:
        raise ValueError(f"a byte-fallback tokenizer needs vocab_size >= {reserved + 10}")
    pieces, merges = _train_metaspace_pieces(vocab_size - reserved)
    vocab = {token: token_id for token_id, token in enumerate(SPECIAL_TOKENS)}
    for byte in range(BYTE_PIECE_COUNT):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    for piece in pieces:
        vocab[piece] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True))
    tokenizer.pre_tokenizer = _metaspace()
    tokenizer.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
        special_tokens=[(BOS_TOKEN, vocab[BOS_TOKEN])],
    )
    _write_model_dir(directory, tokenizer, add_bos_token=True)
    _check_vocab_size(directory, vocab_size)


def tokenizer_vocab_size(directory: Path) -> int:
    """One more than the highest token ID in the directory's tokenizer.json."""
    spec = json.loads((Path(directory) / "tokenizer.json").read_text(encoding="utf-8"))
    token_ids = [*spec["model"]["vocab"].values(), *(t["id"] for t in spec["added_tokens"])]
    return 1 + max(token_ids)


def _metaspace() -> Any:
    from tokenizers import pre_tokenizers

    return pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")


def _train_metaspace_pieces(count: int) -> tuple[list[str], list[tuple[str, str]]]:
    """`count` pieces (a small character alphabet plus merges) learned over Metaspace words."""
    from tokenizers import Tokenizer, models, trainers

    trainer = trainers.BpeTrainer(
        vocab_size=count,
        # A small alphabet leaves CJK, emoji and rarer accents to the byte pieces.
        limit_alphabet=min(24, count // 2),
        show_progress=False,
    )
    scratch = Tokenizer(models.BPE())
    scratch.pre_tokenizer = _metaspace()
    scratch.train_from_iterator(_corpus(), trainer)
    spec = json.loads(scratch.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    if len(vocab) != count:
        raise ValueError(f"training produced {len(vocab)} pieces, wanted {count}")
    # Newer tokenizers releases store merges as pairs, older ones as "left right" strings.
    merges = [
        (m[0], m[1]) if isinstance(m, list) else tuple(m.split(" "))
        for m in spec["model"]["merges"]
    ]
    return sorted(vocab, key=vocab.__getitem__), merges


def _corpus() -> list[str]:
    # A fixed seed keeps the trained vocabulary, and so every test expectation, stable.
    words = _CORPUS_WORDS.split()
    chooser = random.Random(20240601)
    return [" ".join(chooser.choices(words, k=12)) for _ in range(600)]


def _write_model_dir(directory: Path, tokenizer: Any, *, add_bos_token: bool) -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "add_bos_token": add_bos_token,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 2048,
        "chat_template": CHATML_TEMPLATE,
    }
    generation_config = {
        "bos_token_id": tokenizer.token_to_id(BOS_TOKEN),
        "eos_token_id": [tokenizer.token_to_id(EOS_TOKEN), tokenizer.token_to_id(EXTRA_EOS_TOKEN)],
    }
    for name, payload in (
        ("tokenizer_config.json", tokenizer_config),
        ("generation_config.json", generation_config),
    ):
        (directory / name).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


def _check_vocab_size(directory: Path, wanted: int) -> None:
    built = tokenizer_vocab_size(directory)
    if built != wanted:
        raise ValueError(f"built a tokenizer of {built} IDs, wanted {wanted}: enlarge the corpus")


def syllable_corpus(lines: int = 3000, seed: int = 7) -> list[str]:
    """Made-up words of random syllables plus the multi-script words: enough distinct text for
    a few thousand BPE merges."""
    chooser = random.Random(seed)
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"] + ["qu", "th", "sh", "ch"]
    words = _CORPUS_WORDS.split()
    text = []
    for _ in range(lines):
        made = ["".join(chooser.choices(syllables, k=chooser.randint(1, 4))) for _ in range(10)]
        text.append(" ".join(made + chooser.choices(words, k=3)))
    return text


def build_listed_byte_level(directory: Path, *, vocab_size: int) -> None:
    """A byte-level BPE of exactly `vocab_size` IDs without merges: the special tokens, the 256
    byte pieces, then made-up pieces `w0`, `w1`, ... For models with real-size vocabularies
    (Qwen2.5's 151,936) whose tests give prompts as IDs; text encodes byte by byte."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: token_id for token_id, token in enumerate(SPECIAL_TOKENS)}
    for piece in alphabet:
        vocab[piece] = len(vocab)
    if vocab_size < len(vocab):
        raise ValueError(f"a byte-level tokenizer needs vocab_size >= {len(vocab)}")
    for made_up in range(vocab_size - len(vocab)):
        vocab[f"w{made_up}"] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )
    _write_model_dir(directory, tokenizer, add_bos_token=False)
    _check_vocab_size(directory, vocab_size)
