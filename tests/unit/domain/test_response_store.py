"""The response store: least recently used responses, bounded by count and by size."""

from __future__ import annotations

from domain.responses.store import ResponseStore, StoredResponse


def make_stored(size: int = 10) -> StoredResponse:
    return StoredResponse(b"{}", ({"role": "user", "content": "hi"},), size)


def test_the_least_recently_used_response_goes_first_when_the_count_is_reached():
    store = ResponseStore(max_responses=2)
    store.put("a", make_stored())
    store.put("b", make_stored())
    store.get("a")

    store.put("c", make_stored())

    assert store.get("b") is None and store.get("a") is not None and len(store) == 2


def test_the_size_bound_evicts_until_the_new_response_fits():
    store = ResponseStore(max_bytes=25)
    store.put("a", make_stored(10))
    store.put("b", make_stored(10))

    store.put("c", make_stored(10))

    assert store.get("a") is None and store.get("b") is not None and store.get("c") is not None


def test_a_response_larger_than_the_whole_bound_is_not_kept():
    store = ResponseStore(max_bytes=5)

    store.put("a", make_stored(10))

    assert store.get("a") is None and len(store) == 0


def test_putting_an_id_again_replaces_it_without_double_counting():
    store = ResponseStore(max_responses=2, max_bytes=20)
    store.put("a", make_stored(10))
    store.put("a", make_stored(10))

    store.put("b", make_stored(10))

    assert store.get("a") is not None and store.get("b") is not None


def test_size_counts_the_body_and_every_string_of_the_conversation():
    stored = StoredResponse.of(b"12345", [{"role": "user", "content": "abc"}])

    assert stored.size == 5 + 4 * len("roleusercontentabc")


def call_turn(arguments: str, name: str = "f", call_id: str = "call_1") -> dict:
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def test_function_call_arguments_names_and_ids_count_toward_the_size():
    small = StoredResponse.of(b"{}", [call_turn("{}")])

    for big in (
        call_turn("x" * 1000),
        call_turn("{}", name="f" * 1000),
        call_turn("{}", call_id="c" * 1000),
    ):
        assert StoredResponse.of(b"{}", [big]).size - small.size >= 4 * 990


def test_responses_whose_calls_carry_large_arguments_stay_within_the_byte_bound():
    bound = 100_000
    store = ResponseStore(max_responses=256, max_bytes=bound)
    ids = [f"resp_{n}" for n in range(256)]

    for response_id in ids:
        store.put(response_id, StoredResponse.of(b"{}", [call_turn("x" * 10_000)]))

    kept = [stored for stored in map(store.get, ids) if stored is not None]
    assert kept and sum(stored.size for stored in kept) <= bound
    assert sum(len(s.conversation[0]["tool_calls"][0]["function"]["arguments"]) for s in kept) <= (
        bound // 4
    )
