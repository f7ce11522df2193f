"""The prefix-caching block pool: chained keys, salts, references, LRU eviction, no leaks."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.cache.blocks import blocks_needed
from domain.cache.placement import CachePlacement
from domain.cache.pool import HASH_ALGOS, BlockPool, PrefixChain

BLOCK = 4


def placed(pool: BlockPool, prompt: tuple[int, ...], salt: str | None = None) -> CachePlacement:
    """A stream admitted over its hits, its whole prompt computed and published."""
    cache = CachePlacement(prefix=PrefixChain(salt))
    hits = pool.match(cache.prefix, prompt)
    cache.take(pool, hits, len(prompt))
    cache.blocks += pool.allocate(blocks_needed(len(prompt), BLOCK) - len(hits))
    cache.num_computed = len(prompt)
    cache.publish(pool, lambda start, end: prompt[start:end], len(prompt))
    return cache


def test_a_repeated_prompt_reads_its_full_blocks_but_computes_its_last_token():
    pool = BlockPool(16, BLOCK, "sha256")
    first = placed(pool, tuple(range(1, 13)))

    second = CachePlacement(prefix=PrefixChain())
    hits = pool.match(second.prefix, tuple(range(1, 13)))

    # 12 tokens are 3 full blocks, but the last token is computed: 2 blocks hit.
    assert hits == first.blocks[:2]


def test_a_different_block_ends_the_hit_even_after_a_matching_later_block():
    pool = BlockPool(16, BLOCK, "sha256")
    placed(pool, (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13))

    hits = pool.match(PrefixChain(), (1, 2, 3, 4, 9, 9, 9, 9, 9, 10, 11, 12, 13))

    assert len(hits) == 1


def test_another_salt_never_reads_the_blocks():
    pool = BlockPool(16, BLOCK, "sha256")
    prompt = tuple(range(1, 14))
    placed(pool, prompt, salt="alice")

    assert pool.match(PrefixChain("bob"), prompt) == []
    assert pool.match(PrefixChain(None), prompt) == []
    assert len(pool.match(PrefixChain("alice"), prompt)) == 3


def test_freed_cached_blocks_stay_findable_until_a_new_block_needs_them():
    pool = BlockPool(4, BLOCK, "sha256")
    prompt = tuple(range(1, 10))
    cache = placed(pool, prompt)
    pool.free(cache.blocks)

    assert pool.num_free == 4 and len(pool.match(PrefixChain(), prompt)) == 2
    pool.allocate(2)  # the free blocks first, then the oldest freed: the stream's last block
    assert len(pool.match(PrefixChain(), prompt)) == 2
    pool.allocate(2)
    assert pool.match(PrefixChain(), prompt) == []


def test_a_shared_block_has_one_reader_per_stream_and_returns_to_the_pool_with_the_last():
    pool = BlockPool(8, BLOCK, "sha256")
    prompt = tuple(range(1, 10))
    first, second = placed(pool, prompt), placed(pool, prompt)

    assert second.blocks[:2] == first.blocks[:2]
    assert [pool.refs(b) for b in first.blocks[:2]] == [2, 2]
    pool.free(first.blocks)
    pool.free(second.blocks)
    assert pool.num_free == 8 and all(pool.refs(b) == 0 for b in range(8))


def test_lookups_count_queried_and_hit_tokens():
    pool = BlockPool(16, BLOCK, "sha256")
    placed(pool, tuple(range(1, 10)))
    placed(pool, tuple(range(1, 10)))

    assert (pool.queries, pool.hits) == (18, 8)


def test_without_an_algorithm_nothing_is_published_or_found():
    pool = BlockPool(8, BLOCK, None)
    placed(pool, tuple(range(1, 10)))

    assert pool.match(PrefixChain(), tuple(range(1, 10))) == [] and pool.num_cached == 0


@pytest.mark.parametrize("algo", HASH_ALGOS)
def test_each_offered_hash_algorithm_finds_a_repeated_prefix(algo: str):
    pool = BlockPool(8, BLOCK, algo)
    placed(pool, tuple(range(1, 10)))

    assert len(pool.match(PrefixChain(), tuple(range(1, 10)))) == 2


def test_an_unknown_hash_algorithm_is_refused():
    with pytest.raises(ValueError, match="md5"):
        BlockPool(8, BLOCK, "md5")


@dataclass
class _Stream:
    """A stream in the model run: its tokens, salt and placement."""

    tokens: list[int]
    salt: str | None
    cache: CachePlacement = field(default_factory=CachePlacement)


_PREFIXES = ((1, 2, 3, 4, 5, 6, 7, 8, 9), (1, 2, 3, 4, 7, 7, 7, 7), (5, 5, 5, 5, 5))
_op = st.one_of(
    st.tuples(
        st.just("admit"),
        st.integers(0, len(_PREFIXES) - 1),
        st.lists(st.integers(1, 9), max_size=6),
        st.sampled_from((None, "a", "b")),
    ),
    st.tuples(st.just("grow"), st.integers(0, 7), st.integers(1, 5)),
    st.tuples(st.just("preempt"), st.integers(0, 7)),
    st.tuples(st.just("end"), st.integers(0, 7)),
)


@settings(max_examples=150)
@given(st.lists(_op, max_size=40), st.sampled_from(HASH_ALGOS))
def test_random_streams_never_leak_share_across_salts_or_read_wrong_content(ops, algo):
    """A model run: streams with shared prefixes and salts are admitted over their hits, grow
    (allocating, evicting cached blocks, publishing), are preempted (readmitted later over
    their hits) and end. A device model records what each block holds: every hit must hold
    exactly the reader's tokens under the reader's salt, and once every stream ends every
    reference is gone."""
    pool = BlockPool(12, BLOCK, algo)
    device: dict[int, tuple[str | None, tuple[int, ...]]] = {}
    live: list[_Stream] = []
    waiting: list[_Stream] = []

    def admit(stream: _Stream) -> bool:
        cache = stream.cache
        prompt = tuple(stream.tokens)
        hits = pool.match(cache.prefix, prompt)
        if not pool.fits(len(prompt) - len(hits) * BLOCK, hits):
            return False
        for index, block in enumerate(hits):
            assert device[block] == (stream.salt, prompt[index * BLOCK : (index + 1) * BLOCK])
        cache.take(pool, hits, len(prompt))
        cache.blocks += pool.allocate(blocks_needed(len(prompt), BLOCK) - len(hits))
        compute(stream, len(prompt))
        return True

    def compute(stream: _Stream, end: int) -> None:
        cache, tokens = stream.cache, tuple(stream.tokens)
        for index in range(cache.num_computed // BLOCK, blocks_needed(end, BLOCK)):
            block = cache.blocks[index]
            assert pool.refs(block) == 1, "a stream writes only blocks nobody else reads"
            device[block] = (stream.salt, tokens[index * BLOCK : (index + 1) * BLOCK])
        cache.num_computed = end
        cache.publish(pool, lambda start, stop: tokens[start:stop], len(tokens))

    def release(stream: _Stream) -> None:
        pool.free(stream.cache.blocks)
        stream.cache.blocks, stream.cache.published, stream.cache.num_computed = [], 0, 0

    for op in ops:
        if op[0] == "admit":
            _, prefix, suffix, salt = op
            stream = _Stream([*_PREFIXES[prefix], *suffix], salt)
            stream.cache.prefix = PrefixChain(salt)
            if admit(stream):
                live.append(stream)
        elif op[0] == "grow" and live:
            stream = live[op[1] % len(live)]
            need = blocks_needed(len(stream.tokens) + op[2], BLOCK) - len(stream.cache.blocks)
            if need <= pool.num_free:
                stream.cache.blocks += pool.allocate(max(need, 0))
                stream.tokens += [op[2]] * op[2]
                compute(stream, len(stream.tokens))
        elif op[0] == "preempt" and live:
            stream = live.pop(op[1] % len(live))
            release(stream)
            waiting.append(stream)
        elif op[0] == "end" and (live or waiting):
            group = live if live else waiting
            stream = group.pop(op[1] % len(group))
            if group is live:
                release(stream)
        if waiting and admit(waiting[0]):
            live.append(waiting.pop(0))
        referenced = {block for s in live for block in s.cache.blocks}
        assert pool.num_free == pool.num_blocks - len(referenced)
        for block in range(pool.num_blocks):
            assert pool.refs(block) == sum(s.cache.blocks.count(block) for s in live)

    for stream in live:
        release(stream)
    assert pool.num_free == pool.num_blocks
    assert all(pool.refs(block) == 0 for block in range(pool.num_blocks))
