"""Token names and bytes on the wire are memoized for the server's life, not per request."""

from __future__ import annotations

from adapters.http import generation
from adapters.http.serving import ServedModel
from domain.requests.api_request import ApiRequest, Prompt
from domain.requests.sampling import SamplingParams
from tests.fakes import FakeTokenizer


class CountingTokenizer(FakeTokenizer):
    """The fake tokenizer, counting how often each token's bytes are read."""

    def __init__(self) -> None:
        self.reads: dict[int, int] = {}

    def token_bytes(self, token_id: int) -> bytes:
        self.reads[token_id] = self.reads.get(token_id, 0) + 1
        return super().token_bytes(token_id)


def job(*, as_token_ids: bool = False) -> ApiRequest:
    return ApiRequest(
        None,
        (Prompt((1, 2), "ab"),),
        SamplingParams(),
        max_tokens=1,
        return_tokens_as_token_ids=as_token_ids,
    )


def test_requests_of_one_server_share_its_token_names_and_bytes():
    tokenizer = CountingTokenizer()
    served = ServedModel("m", tokenizer, engine=None)

    first, second = generation.rendering(job(), served), generation.rendering(job(), served)
    assert first is second
    assert first.texts([3, 4, 3]) == ["d", "e", "d"]
    assert second.text(3) == "d" and second.byte_lists([4, 4]) == [[ord("e")], [ord("e")]]

    assert tokenizer.reads == {3: 1, 4: 2}  # a name and a byte list each read a token once


def test_a_request_for_token_id_names_gets_the_servers_other_rendering():
    served = ServedModel("m", CountingTokenizer(), engine=None)

    named = generation.rendering(job(as_token_ids=True), served)

    assert named is generation.rendering(job(as_token_ids=True), served)
    assert named is not generation.rendering(job(), served)
    assert named.texts([7, 2]) == ["token_id:7", "token_id:2"]


def test_byte_lists_handed_out_are_fresh_lists():
    rendering = generation.rendering(job(), ServedModel("m", CountingTokenizer(), engine=None))
    handed = rendering.byte_lists([5])[0]
    handed.append(0)

    assert rendering.byte_list(5) == [ord("f")]
