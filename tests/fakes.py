"""Fakes of our own ports for unit tests: a deterministic executor, a tiny byte tokenizer, a
recording engine observer and a clock that moves only when told."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from domain.logprobs import NO_TOKEN, PositionLogprobs, TokenLogprob
from domain.prompt_scores import PromptScore
from domain.records import CompletionRecord, Finish, Role
from domain.step import ExecutorGeometry, SlotWork, StepPlan
from domain.step_stats import SchedulerState, StepStats
from ports.executor import FrameResult

FAKE_VOCAB = 64
FAKE_EOS = 0
# What the fake says its reads copied: a made-up size per position and per scored row.
FAKE_POSITION_BYTES = 100
FAKE_PROMPT_ROW_BYTES = 10


def next_token(context: Sequence[int], vocab_size: int = FAKE_VOCAB) -> int:
    """The fake model: a deterministic function of the whole context, never EOS unless forced."""
    value = 7
    for position, token_id in enumerate(context):
        value = (value * 31 + token_id * (position + 3)) % 1_000_003
    return 1 + value % (vocab_size - 1)


class FakeExecutor:
    """Implements ModelExecutor: remembers fed tokens per slot, commits records like the real one.

    It checks what a real cache would need: chunks arrive in position order per slot, and no KV
    block is used by two live slots at once. With `logprobs`, requesting lanes get a position per
    emitted token (the chosen token at -1.0); scored lanes always get a score per targeted row.
    Reads report FAKE_POSITION_BYTES and FAKE_PROMPT_ROW_BYTES of payload for each.
    """

    def __init__(
        self, geometry: ExecutorGeometry, *, eos_after: int | None = None, logprobs: bool = False
    ) -> None:
        self.geometry = geometry
        self._logprobs = logprobs
        self._contexts: dict[int, list[int]] = {}
        self._tables: dict[int, tuple[int, ...]] = {}
        self._frames: list[FrameResult] = [FrameResult(0, ()), FrameResult(1, ())]
        self._next = 0
        self._eos_after = eos_after
        self.plans: list[StepPlan] = []

    def submit(self, plan: StepPlan) -> int:
        self.plans.append(plan)
        records = []
        for work in plan.works:
            context = self._contexts.setdefault(work.slot, [])
            if work.start_position == 0:
                context.clear()
            if len(context) != work.start_position:
                raise AssertionError(
                    f"slot {work.slot} fed at {work.start_position}, cache has {len(context)}"
                )
            context.extend(work.token_ids)
            self._tables[work.slot] = work.block_table
            if not work.sample:
                records.append(
                    CompletionRecord(
                        work.slot, work.epoch, Role.PROMPT, first_position=work.end_position
                    )
                )
                continue
            token_id = next_token(context, self.geometry.vocab_size)
            generated = work.end_position - work.prompt_len + 1
            if self._eos_after is not None and generated > self._eos_after:
                token_id = FAKE_EOS
            if token_id in work.banned_token_ids:
                token_id = 1 + token_id % (self.geometry.vocab_size - 1)
            finish = Finish.NONE
            if token_id in work.stop_token_ids:
                finish = Finish.STOP_TOKEN
            elif work.remaining <= 1:
                finish = Finish.LENGTH
            records.append(
                CompletionRecord(
                    work.slot,
                    work.epoch,
                    Role.SAMPLE,
                    (token_id,),
                    work.end_position,
                    finish=finish,
                )
            )
        self._check_blocks(plan)
        frame = self._next
        self._next ^= 1
        self._frames[frame] = _frame_result(frame, plan, tuple(records), self._logprobs)
        return frame

    def read(self, frame: int) -> FrameResult:
        return self._frames[frame]

    def _check_blocks(self, plan: StepPlan) -> None:
        live = {work.slot for work in plan.works}
        seen: dict[int, int] = {}
        for slot in live:
            for block in self._tables[slot]:
                if block in seen and seen[block] != slot:
                    raise AssertionError(f"block {block} used by slots {seen[block]} and {slot}")
                seen[block] = slot


def _frame_result(
    frame: int, plan: StepPlan, records: tuple[CompletionRecord, ...], with_logprobs: bool
) -> FrameResult:
    logprobs = tuple(
        tuple(PositionLogprobs(TokenLogprob(t, -1.0)) for t in record.tokens)
        if with_logprobs and work.logprobs is not None and work.sample
        else None
        for work, record in zip(plan.works, records, strict=True)
    )
    positions = sum(len(lane) for lane in logprobs if lane is not None)
    scores = tuple(_scored_rows(work) for work in plan.works) if plan.scored else ()
    rows = sum(len(lane) for lane in scores)
    return FrameResult(
        frame,
        records,
        logprobs if positions else (),
        scores,
        payload_bytes=positions * FAKE_POSITION_BYTES + rows * FAKE_PROMPT_ROW_BYTES,
    )


def _scored_rows(work: SlotWork) -> tuple[PromptScore | None, ...]:
    return tuple(
        None if target == NO_TOKEN else PromptScore(target, -0.5, 1)
        for target in work.prompt_targets
    )


class RecordingObserver:
    """Implements EngineObserver: keeps every StepStats it is given."""

    def __init__(self) -> None:
        self.steps: list[StepStats] = []

    def record_step(self, stats: StepStats) -> None:
        self.steps.append(stats)

    def total(self, name: str) -> int:
        """The sum of a count field over every step."""
        return sum(getattr(step, name) for step in self.steps)

    def observed(self, name: str) -> list:
        """A tuple field's observations over every step, in order."""
        return [value for step in self.steps for value in getattr(step, name)]

    @property
    def state(self) -> SchedulerState:
        return self.steps[-1].state if self.steps else SchedulerState()


class ManualClock:
    """A monotonic clock in seconds that moves only when a test sets or advances it."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeTokenizer:
    """Implements Tokenizer: token t is the single byte `a` + t % 26 for t >= 1; 0 is `</s>`."""

    vocab_size = FAKE_VOCAB
    eos_token_ids = frozenset({FAKE_EOS})
    bos_token_id = None
    special_token_ids = frozenset({FAKE_EOS})
    strips_leading_space = False

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return [1 + (ord(ch) - ord("a")) % 26 for ch in text]

    def token_bytes(self, token_id: int) -> bytes:
        return b"</s>" if token_id == FAKE_EOS else bytes([ord("a") + token_id % 26])

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return b"".join(
            self.token_bytes(t) for t in token_ids if not (skip_special_tokens and t == FAKE_EOS)
        ).decode()

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, object]], *, add_generation_prompt: bool = True
    ) -> str:
        return "".join(str(m["content"]) for m in messages)
