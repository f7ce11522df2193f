"""Prefix caching through the engine over the fake executor, whose KV cache lives in blocks:
every output equals the uncached run's, hits skip prefill, salts and scoring keep apart."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from domain.contract.capabilities import LogprobCapability
from domain.emission.outputs import ChoiceDelta, PromptScores, RequestEnd, Usage
from domain.engine.engine import Engine, EngineConfig
from domain.logprobs.rules import LogprobAsk
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams
from domain.speculation.drafts import SpeculativeConfig, SpeculativeMethod
from domain.telemetry.step_stats import SchedulerState
from tests.fakes import FakeExecutor, FakeTokenizer, RecordingObserver
from tests.support.draining import channel_items, step_until_idle
from tests.support.geometry import fake_geometry

SYSTEM = tuple(1 + (i * 11) % 60 for i in range(21))  # five full blocks of 4 and one token
SCORING = LogprobCapability(top_k=20, selects_ids=True, scored_capacities=(32,))
NGRAM = SpeculativeConfig(SpeculativeMethod.NGRAM, 3, 1, 3)


def request(
    rid: str,
    suffix: tuple[int, ...] = (),
    *,
    prefix: tuple[int, ...] = SYSTEM,
    max_tokens: int = 6,
    n: int = 1,
    logprobs: bool = False,
    prompt_logprobs: int | None = None,
    salt: str | None = None,
    **params,
) -> EngineRequest:
    ask = LogprobAsk(
        wanted=logprobs, count=2 if logprobs else None, prompt_logprobs=prompt_logprobs
    )
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, **params)
    return EngineRequest(rid, prefix + suffix, sampling, n, logprobs=ask, cache_salt=salt)


class Run:
    """One engine over the fake executor, fed in waves."""

    def __init__(self, caching: bool, *, num_blocks: int = 64, **config) -> None:
        self.observer = RecordingObserver()
        geometry = fake_geometry(logprobs=SCORING, num_blocks=num_blocks, max_model_len=40)
        self.executor = FakeExecutor(geometry)
        options = {"max_num_batched_tokens": 16, **config}
        self.engine = Engine(
            self.executor,
            FakeTokenizer(),
            EngineConfig(prefix_caching="sha256" if caching else None, **options),
            observer=self.observer,
        )
        self.channels: dict = {}

    def submit(self, *requests: EngineRequest) -> None:
        for r in requests:
            self.channels[r.request_id] = self.engine.submit(r)

    def steps(self, count: int) -> None:
        for _ in range(count):
            if self.engine.has_work():
                self.engine.step()

    def finish(self) -> dict[str, dict]:
        step_until_idle(self.engine)
        found = {rid: outputs(channel_items(ch)) for rid, ch in self.channels.items()}
        assert self.observer.state == SchedulerState(), "every block's readers are gone"
        return found

    def first_lanes(self) -> list[tuple[int, int]]:
        """(start position, tokens fed) of each lane that began a slot's life."""
        seen, found = set(), []
        for plan in self.executor.plans:
            for work in plan.works:
                if (work.slot, work.epoch) not in seen:
                    seen.add((work.slot, work.epoch))
                    found.append((work.start_position, len(work.token_ids)))
        return found


def outputs(items: list) -> dict:
    """Per choice its tokens, text, logprob entries and finish; the prompt scores; the error."""
    found: dict = {"scores": [], "error": None}
    for item in items:
        if isinstance(item, PromptScores):
            found["scores"].append(item)
        elif isinstance(item, RequestEnd):
            found["error"] = item.error
        elif isinstance(item, ChoiceDelta):
            tokens, text, entries, _ = found.setdefault(item.index, [(), "", (), None])
            finish = (item.finish_reason, item.stop_reason) if item.finished else None
            found[item.index] = [
                tokens + item.token_ids,
                text + item.text,
                entries + item.logprobs,
                finish,
            ]
    return found


def both(waves, **config) -> tuple[dict, dict, Run]:
    """Runs the waves (requests, then steps before the next wave) without and with the cache."""
    results = []
    for caching in (False, True):
        run = Run(caching, **config)
        for requests, steps in waves:
            run.submit(*requests)
            run.steps(steps)
        results.append((run.finish(), run))
    (plain, _), (cached, run) = results
    return plain, cached, run


def test_a_repeated_system_prompt_is_read_not_computed_and_changes_no_output():
    waves = [([request("first", (5, 6), logprobs=True)], 20), ([request("again", (7,))], 0)]

    plain, cached, run = both(waves)

    assert cached == plain
    # Five full blocks hit: the follow-up starts at position 20 and computes its last three.
    assert run.first_lanes()[1] == (20, 2)


def test_a_full_hit_still_computes_the_last_prompt_token_and_samples_the_first_token():
    prompt = SYSTEM[:20]  # exactly five blocks
    waves = [([request("a", prefix=prompt, logprobs=True)], 20)]
    waves.append(([request("b", prefix=prompt, logprobs=True)], 0))

    plain, cached, run = both(waves)

    assert cached == plain
    assert run.first_lanes()[1] == (16, 4)


def test_another_salt_reads_nothing_and_the_same_salt_reads_the_prefix():
    waves = [([request("alice", salt="alice")], 20)]
    waves.append(([request("bob", salt="bob"), request("unsalted")], 20))
    waves.append(([request("alice-again", salt="alice")], 0))

    plain, cached, run = both(waves)

    assert cached == plain
    assert [start for start, _ in run.first_lanes()] == [0, 0, 0, 20]


def test_a_scored_prompt_computes_every_row_but_publishes_its_blocks():
    waves = [([request("plain")], 20), ([request("scored", prompt_logprobs=2)], 20)]
    waves.append(([request("after", (9,))], 0))

    plain, cached, run = both(waves)

    assert cached == plain and cached["scored"]["scores"]
    starts = [start for start, _ in run.first_lanes()]
    assert starts[1] == 0 and starts[2] == 20


def test_penalties_compute_the_prompt_they_count():
    waves = [([request("plain")], 20), ([request("penalized", repetition_penalty=1.3)], 0)]

    plain, cached, run = both(waves)

    assert cached == plain and run.first_lanes()[1][0] == 0


def test_siblings_of_a_later_request_share_the_prompt_blocks():
    waves = [([request("first")], 20), ([request("siblings", n=3, max_tokens=4)], 0)]

    plain, cached, run = both(waves)

    assert cached == plain
    assert [start for start, _ in run.first_lanes()[1:]] == [20, 20, 20]


def test_siblings_wait_a_step_for_the_first_choice_s_prompt_blocks_and_read_them():
    plain, cached, run = both([([request("siblings", n=3, max_tokens=4)], 0)])

    assert cached == plain
    # Choice 0 prefills in two chunks of the 16-token budget; then its siblings each compute
    # the prompt's last token only.
    assert run.first_lanes() == [(0, 16), (20, 1), (20, 1)]


def test_hits_count_as_queries_and_hits_in_tokens():
    waves = [([request("first")], 20), ([request("second", (3, 4))], 0)]

    _, _, run = both(waves)

    totals = (run.observer.total("prefix_cache_queries"), run.observer.total("prefix_cache_hits"))
    assert totals == (21 + 23, 20)


_streams = st.lists(
    st.tuples(
        st.integers(0, 2),  # which shared prefix
        st.lists(st.integers(1, 63), max_size=6),  # its own suffix
        st.integers(1, 8),  # max tokens
        st.sampled_from((None, "a", "b")),
        st.integers(1, 2),  # n
        st.booleans(),  # logprobs
        st.integers(0, 6),  # steps before the next request arrives
    ),
    min_size=1,
    max_size=8,
)
_PREFIXES = (SYSTEM, SYSTEM[:9] + (2, 2, 2, 2, 2), tuple(range(30, 43)))


@settings(max_examples=40)
@given(
    _streams,
    st.sampled_from((10, 14, 64)),  # KV blocks: 10 and 14 preempt and evict
    st.sampled_from(("plain", "overlapped", "ngram")),
    st.lists(st.integers(0, 7), max_size=2),  # requests to abort
)
def test_random_streams_with_shared_prefixes_salts_preemption_and_aborts_equal_the_uncached_run(
    streams, num_blocks, mode, aborted
):
    """Outputs of the requests that run to their end equal the uncached run's; an aborted
    request's tokens are a prefix of what it would have said; every block ends unreferenced."""
    config = {
        "num_blocks": num_blocks,
        "async_scheduling": mode == "overlapped",
        "speculative": NGRAM if mode == "ngram" else None,
    }
    requests = [
        request(
            f"r{i}", tuple(suffix), prefix=_PREFIXES[p], max_tokens=m, n=n, salt=salt, logprobs=lp
        )
        for i, (p, suffix, m, salt, n, lp, _) in enumerate(streams)
    ]
    reference = Run(False, **config)
    reference.submit(*requests)
    expected = reference.finish()
    runs = []
    for caching in (False, True):
        run = Run(caching, **config)
        for index, (r, stream) in enumerate(zip(requests, streams, strict=True)):
            run.submit(r)
            run.steps(stream[-1])
            if index in aborted:
                run.engine.abort(r.request_id)
        runs.append(run.finish())
    for found in runs:
        for rid, result in found.items():
            if int(rid[1:]) not in aborted:
                assert result == expected[rid], rid
                continue
            for index in range(requests[int(rid[1:])].n):
                tokens = result.get(index, [()])[0]
                assert tokens == expected[rid][index][0][: len(tokens)], rid


def test_usage_counts_the_prompt_tokens_a_request_read_from_the_cache():
    run = Run(True)
    first = run.engine.submit(request("first", (5, 6), n=2))
    run.steps(20)
    second = run.engine.submit(request("second", (7,), n=2))
    step_until_idle(run.engine)

    assert channel_items(first)[-1].usage.cached_tokens == 0
    # Counted once per prompt, from the first choice: five blocks of four.
    assert channel_items(second)[-1].usage == Usage(22, 12, 20)
