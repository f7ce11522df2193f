"""Fakes of our own ports for unit tests: a deterministic executor and a tiny byte tokenizer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from domain.records import CompletionRecord, Finish, Role
from domain.step import ExecutorGeometry, StepPlan
from ports.executor import FrameResult

FAKE_VOCAB = 64
FAKE_EOS = 0


def next_token(context: Sequence[int], vocab_size: int = FAKE_VOCAB) -> int:
    """The fake model: a deterministic function of the whole context, never EOS unless forced."""
    value = 7
    for position, token_id in enumerate(context):
        value = (value * 31 + token_id * (position + 3)) % 1_000_003
    return 1 + value % (vocab_size - 1)


class FakeExecutor:
    """Implements ModelExecutor: remembers fed tokens per slot, commits records like the real one.

    It checks what a real cache would need: chunks arrive in position order per slot, and no KV
    block is used by two live slots at once.
    """

    def __init__(self, geometry: ExecutorGeometry, *, eos_after: int | None = None) -> None:
        self.geometry = geometry
        self._contexts: dict[int, list[int]] = {}
        self._tables: dict[int, tuple[int, ...]] = {}
        self._frames: list[tuple[CompletionRecord, ...]] = [(), ()]
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
                records.append(CompletionRecord(work.slot, work.epoch, Role.PROMPT))
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
        self._frames[frame] = tuple(records)
        return frame

    def read(self, frame: int) -> FrameResult:
        return FrameResult(frame, self._frames[frame])

    def _check_blocks(self, plan: StepPlan) -> None:
        live = {work.slot for work in plan.works}
        seen: dict[int, int] = {}
        for slot in live:
            for block in self._tables[slot]:
                if block in seen and seen[block] != slot:
                    raise AssertionError(f"block {block} used by slots {seen[block]} and {slot}")
                seen[block] = slot


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
