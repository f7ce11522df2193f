"""Fakes of our own ports for unit tests: a deterministic executor, a tiny byte tokenizer, a
grammar compiler of literal choices, a recording engine observer and a clock that moves only
when told."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from domain.common.errors import InvalidRequestError
from domain.contract.frames import FrameResult, LaneFailure
from domain.contract.geometry import ExecutorGeometry
from domain.contract.records import CompletionRecord, Finish, Role
from domain.engine.commit import commit_round, forced_round
from domain.engine.step import SlotWork, StepPlan
from domain.logprobs.prompt_scores import PromptScore
from domain.logprobs.values import (
    NATURAL_TOP_K,
    NO_TOKEN,
    LogprobOptions,
    PositionLogprobs,
    TokenLogprob,
    bits_to_float,
    float_to_bits,
    sort_key,
)
from domain.overlap.pending import last_tokens, resolve_pending
from domain.speculation.verdict import speculative_verdict
from domain.structured.catch_up import grammar_catch_up
from domain.structured.grammar import GrammarKind, GrammarSpec
from domain.telemetry.step_stats import SchedulerState, StepStats

if TYPE_CHECKING:
    from ports.executor import ModelExecutor
    from ports.grammar import CompiledGrammar, GrammarCompiler, GrammarMatcher
    from ports.tokenizer import Tokenizer

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


def _kv_digest(digest: int, token_id: int) -> int:
    """The fake cache's digest of a context extended by one token."""
    return (digest * 1_000_003 + token_id + 2) % (1 << 61)


# A fake model: the context and the vocabulary size give the greedy next token.
FakeModel = Callable[[Sequence[int], int], int]


def fake_logprobs(
    context: Sequence[int], vocab_size: int = FAKE_VOCAB, model: FakeModel = next_token
) -> list[float]:
    """The fake model's FP32 logprobs after `context`: the model's token is the argmax, the
    other values spread over about ten nats (with ties), normalized by a float64 logsumexp."""
    favourite = model(context, vocab_size)
    spread = next_token([*context, 1], 997)
    logits = [-((token_id * 7919 + spread) % 211) / 20.0 for token_id in range(vocab_size)]
    logits[favourite] = 1.0
    peak = max(logits)
    normalizer = peak + math.log(sum(math.exp(value - peak) for value in logits))
    return [bits_to_float(float_to_bits(value - normalizer)) for value in logits]


def _ranked(values: Sequence[float], count: int) -> tuple[TokenLogprob, ...]:
    """The `count` best (token ID, value) pairs by the reported order."""
    best = sorted(range(len(values)), key=lambda t: sort_key(values[t], t), reverse=True)
    return tuple(TokenLogprob(t, values[t]) for t in best[:count])


def fake_position(
    context: Sequence[int],
    token_id: int,
    options: LogprobOptions,
    top_k: int,
    vocab_size: int,
    model: FakeModel = next_token,
) -> PositionLogprobs:
    """What a requesting lane reports for `token_id` emitted after `context`."""
    values = fake_logprobs(context, vocab_size, model)
    if options.token_ids:
        alternatives = tuple(TokenLogprob(t, values[t]) for t in options.token_ids)
    else:
        alternatives = _ranked(values, top_k)
    return PositionLogprobs(TokenLogprob(token_id, values[token_id]), alternatives)


def fake_prompt_score(
    context: Sequence[int], target: int, vocab_size: int, model: FakeModel = next_token
) -> PromptScore:
    """The score of prompt token `target` after `context`, with 20 natural alternatives."""
    values = fake_logprobs(context, vocab_size, model)
    rank = 1 + sum(1 for value in values if value > values[target])
    return PromptScore(target, values[target], rank, _ranked(values, NATURAL_TOP_K))


class _Retired(Exception):
    """A lane's grammar broke: the fake retires the lane with this message."""


class FakeExecutor:
    """Implements ModelExecutor over the fake model: commits records through the shared commit
    rule and reports logprob payloads and prompt scores like the real one.

    It keeps a KV cache as a real one does, per block: each position holds the token fed there
    and a digest of the whole context up to it. A lane reads its context from the positions
    below its start through its block table, so a wrong table, a block evicted and rewritten,
    or a position never computed is a failed step, never a silently right answer; and a lane
    writes only into blocks no other lane of its step reads. `eos_after` makes every lane emit
    EOS once it has generated that many tokens. Reads report FAKE_POSITION_BYTES and
    FAKE_PROMPT_ROW_BYTES of payload for each position and scored row they carry.

    A lane whose grammar refuses its tokens (a FakeGrammarCompiler `row_limit`) is retired as
    the real executor retires it: an INVALID record that finishes with ERROR, and a
    LaneFailure naming the constraint's field.
    """

    def __init__(
        self,
        geometry: ExecutorGeometry,
        *,
        eos_after: int | None = None,
        model: FakeModel = next_token,
        draft_model: FakeModel | None = None,
        grammars: GrammarCompiler | None = None,
    ) -> None:
        self.geometry = geometry
        self._grammars = grammars
        # slot -> (epoch, matcher, generated tokens it accepted), as a real executor keeps them
        self._matchers: dict[int, tuple[int, GrammarMatcher, int]] = {}
        self._model = model
        self._draft_model = draft_model
        self._draft_contexts: dict[int, list[int]] = {}
        # block -> per offset, (token ID, digest of the context through it) once written
        self._kv: dict[int, list[tuple[int, int] | None]] = {}
        self._frames: list[FrameResult] = [FrameResult(0, ()), FrameResult(1, ())]
        self._next = 0
        self._previous: tuple[CompletionRecord, ...] = ()
        self._eos_after = eos_after
        self.plans: list[StepPlan] = []
        # (slot, position) of every forced token it emitted, for tests of the thinking budget.
        self.forced_positions: list[tuple[int, int]] = []

    def submit(self, plan: StepPlan) -> int:
        self.plans.append(plan)
        plan = resolve_pending(plan, last_tokens(self._previous))
        frame = self._next
        self._next ^= 1
        records: list[CompletionRecord] = []
        payloads: list[tuple[PositionLogprobs, ...] | None] = []
        scores: list[tuple[PromptScore | None, ...]] = []
        failures: list[LaneFailure] = []
        self._check_blocks(plan)
        for work in plan.works:
            context = self._feed(work, scores if plan.scored else None)
            try:
                record = self._record(work, context)
            except _Retired as retired:
                # As the real executor does: the lane emits nothing and its request fails.
                record = CompletionRecord(
                    work.slot,
                    work.epoch,
                    Role.INVALID,
                    first_position=work.end_position,
                    finish=Finish.ERROR,
                )
                param = work.grammar.spec.param if work.grammar is not None else None
                failures.append(LaneFailure(work.slot, work.epoch, str(retired), param))
                self._matchers.pop(work.slot, None)
            self._write(work, context)
            records.append(record)
            payloads.append(self._payload(work, context, record) if record.emits else None)
        self._previous = tuple(records)
        positions = sum(len(payload) for payload in payloads if payload is not None)
        rows = sum(len(lane) for lane in scores)  # every fed row is copied, scored or not
        self._frames[frame] = FrameResult(
            frame,
            tuple(records),
            tuple(payloads) if any(p is not None for p in payloads) else (),
            tuple(scores),
            payload_bytes=positions * FAKE_POSITION_BYTES + rows * FAKE_PROMPT_ROW_BYTES,
            failures=tuple(failures),
        )
        return frame

    def _record(self, work: SlotWork, context: list[int]) -> CompletionRecord:
        """The lane's record; raises _Retired when its grammar breaks."""
        if work.grammar is not None:
            self._catch_up(work)
        if not work.sample:
            return CompletionRecord(
                work.slot, work.epoch, Role.PROMPT, first_position=work.end_position
            )
        if work.forced_token is not None:
            return self._forced(work)
        if work.speculation is not None:
            return self._verify(work, context)
        emitted, finish, _ = commit_round(work, (self._sample(work, context),))
        self._advance(work, emitted)
        return CompletionRecord(
            work.slot,
            work.epoch,
            Role.SAMPLE,
            emitted,
            work.end_position,
            finish=finish,
            generated_total=work.end_position - work.prompt_len + 1,
        )

    def land(self) -> int | None:
        """Every submission commits at once here: no step waits to land."""
        return None

    def settle(self, frame: int) -> None:
        """Every submission commits at once here."""

    def read(self, frame: int) -> FrameResult:
        return self._frames[frame]

    def _feed(self, work: SlotWork, scores: list | None) -> list[int]:
        context = self._read(work)
        rows = []
        for token_id, target in zip(
            work.token_ids, work.prompt_targets or [NO_TOKEN] * len(work.token_ids), strict=True
        ):
            context.append(token_id)
            if scores is not None:
                rows.append(
                    None
                    if target == NO_TOKEN
                    else fake_prompt_score(context, target, self.geometry.vocab_size, self._model)
                )
        if scores is not None:
            scores.append(tuple(rows))
        return context

    def _read(self, work: SlotWork) -> list[int]:
        """The lane's context below its start, as its block table finds it in the cache."""
        size, context, digest = self.geometry.block_size, [], 0
        for position in range(work.start_position):
            if position // size >= len(work.block_table):
                raise AssertionError(f"slot {work.slot} has no block for position {position}")
            block = work.block_table[position // size]
            entry = self._kv.get(block, [None] * size)[position % size]
            if entry is None:
                raise AssertionError(f"slot {work.slot} reads position {position} never written")
            digest = _kv_digest(digest, entry[0])
            if entry[1] != digest:
                raise AssertionError(
                    f"slot {work.slot} reads position {position} from block {block}, written "
                    "after another context"
                )
            context.append(entry[0])
        return context

    def _write(self, work: SlotWork, context: list[int]) -> None:
        """Stores the KV of the positions the lane computed (its accepted drafts included)."""
        size, digest = self.geometry.block_size, 0
        for position, token_id in enumerate(context):
            digest = _kv_digest(digest, token_id)
            if position < work.start_position:
                continue
            if position // size >= len(work.block_table):
                raise AssertionError(f"slot {work.slot} has no block for position {position}")
            block = self._kv.setdefault(work.block_table[position // size], [None] * size)
            block[position % size] = (token_id, digest)

    def _catch_up(self, work: SlotWork) -> None:
        """Brings the slot's matcher in step with the lane by the shared catch-up rule
        (`domain.structured.catch_up`), as GrammarLanes does."""
        if self._grammars is None or work.grammar is None:
            raise AssertionError("a lane is constrained, but the fake has no grammar compiler")
        state = self._matchers.get(work.slot)
        catch_up = grammar_catch_up(
            work, None if state is None else state[0], 0 if state is None else state[2]
        )
        if state is None or catch_up.restart:
            state = (work.epoch, self._grammars.compile(work.grammar.spec).matcher(), 0)
        epoch, matcher, generated = state
        if catch_up.unseen and not matcher.accept(catch_up.unseen):
            raise _Retired(f"the {work.grammar.spec.kind.value} output constraint broke mid-output")
        self._matchers[work.slot] = (epoch, matcher, generated + len(catch_up.unseen))

    def _advance(self, work: SlotWork, emitted: Sequence[int]) -> None:
        if work.grammar is None or not emitted:
            return
        epoch, matcher, generated = self._matchers[work.slot]
        if not matcher.accept(emitted):
            assert work.grammar is not None
            raise _Retired(f"the {work.grammar.spec.kind.value} output constraint broke mid-output")
        self._matchers[work.slot] = (epoch, matcher, generated + len(emitted))

    def _sample(self, work: SlotWork, context: Sequence[int]) -> int:
        """The fake model's (greedy) choice after `context`; a constrained lane takes it when
        its grammar allows it, else the allowed token of the highest fake logprob."""
        vocab_size = self.geometry.vocab_size
        token_id = self._model(context, vocab_size)
        generated = len(context) - work.prompt_len + 1
        if self._eos_after is not None and generated > self._eos_after:
            token_id = FAKE_EOS
        if token_id in work.sampling.banned_token_ids:
            token_id = 1 + token_id % (vocab_size - 1)
        if work.grammar is None:
            return token_id
        allowed = self._matchers[work.slot][1].allowed_token_ids()
        if token_id in allowed:
            return token_id
        values = fake_logprobs(context, vocab_size, self._model)
        return max(allowed, key=lambda t: sort_key(values[t], t))

    def _forced(self, work: SlotWork) -> CompletionRecord:
        """A forced lane emits its token through the commit rule, marked forced; it never
        consults the model, as the real executor never projects its row."""
        emitted, finish, mask = forced_round(work)
        self.forced_positions.append((work.slot, work.end_position))
        return CompletionRecord(
            work.slot,
            work.epoch,
            Role.SAMPLE,
            emitted,
            work.end_position,
            forced_mask=mask,
            finish=finish,
            generated_total=work.end_position - work.prompt_len + len(emitted),
        )

    def _propose(self, work: SlotWork, context: list[int]) -> tuple[int, ...]:
        """The fake draft model's greedy drafts, on a draft cache it checks like a real one:
        it must hold exactly the target's tokens below `draft_start`."""
        if self._draft_model is None:
            raise AssertionError("a lane asks for draft-model proposals; the fake has no draft")
        lane = work.speculation
        assert lane is not None
        cache = self._draft_contexts.setdefault(work.slot, [])
        start = lane.draft_start
        if len(cache) < start or cache[:start] != context[:start]:
            raise AssertionError(
                f"slot {work.slot}: draft cache of {len(cache)} positions cannot start at "
                f"{start} with the target's tokens"
            )
        del cache[start:]
        cache.extend(lane.draft_feed)
        drafts: list[int] = []
        for index in range(lane.propose):
            drafts.append(self._draft_model(cache, self.geometry.vocab_size))
            if index < lane.propose - 1:
                cache.append(drafts[-1])  # the last draft is never fed to the draft model
        return tuple(drafts)

    def _verify(self, work: SlotWork, context: list[int]) -> CompletionRecord:
        """Greedy verification under the shared speculative verdict (`domain.verdict`): a row
        keeps its draft when the draft is the model's choice there."""
        proposes = work.speculation is not None and work.speculation.propose > 0
        drafts = self._propose(work, context) if proposes else work.drafts
        context.extend(drafts[len(work.drafts) :])  # proposed drafts are fed like history ones
        cached = len(context) - len(drafts)
        matcher = self._matchers[work.slot][1] if work.grammar is not None else None

        def rows() -> Iterator[tuple[bool, int]]:
            for index in range(len(drafts) + 1):
                token_id = self._sample(work, context[: cached + index])
                kept = index < len(drafts) and token_id == drafts[index]
                yield kept, token_id
                if matcher is not None and kept:
                    matcher.accept((drafts[index],))  # the next row is masked after it

        verdict = speculative_verdict(drafts, rows())
        if matcher is not None:
            matcher.rollback(verdict.accepted)
        # Rejected drafts were fed, but a real cache's positions for them hold nothing valid.
        del context[cached + verdict.accepted :]
        emitted, finish, accepted = commit_round(work, verdict.tokens, verdict.accepted)
        self._advance(work, emitted)
        return CompletionRecord(
            work.slot,
            work.epoch,
            Role.SPECULATIVE,
            emitted,
            work.first_emitted_position,
            finish=finish,
            drafts_offered=len(drafts),
            drafts_accepted=accepted,
            generated_total=work.first_emitted_position - work.prompt_len + len(emitted),
        )

    def _payload(
        self, work: SlotWork, context: list[int], record: CompletionRecord
    ) -> tuple[PositionLogprobs, ...] | None:
        """Each emitted token's position, scored after the tokens before it."""
        if work.sampling.logprobs is None or not self.geometry.logprobs.top_k:
            return None
        geometry = self.geometry
        before = list(context[: record.first_position])
        positions = []
        for token_id in record.tokens:
            positions.append(
                fake_position(
                    before,
                    token_id,
                    work.sampling.logprobs,
                    work.sampling.logprobs.top_k,
                    geometry.vocab_size,
                    self._model,
                )
            )
            before.append(token_id)
        return tuple(positions)

    def _check_blocks(self, plan: StepPlan) -> None:
        """No lane writes into a block another lane of the step holds (shared prefix blocks
        are only read)."""
        size = self.geometry.block_size
        held: dict[int, set[int]] = {}
        for work in plan.works:
            for block in work.block_table:
                held.setdefault(block, set()).add(work.slot)
        for work in plan.works:
            first = work.start_position // size
            for block in work.block_table[first:]:
                if held[block] != {work.slot}:
                    raise AssertionError(
                        f"slot {work.slot} writes block {block}, which others hold"
                    )


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


@dataclass
class FakeChoiceMatcher:
    """Implements GrammarMatcher over literal choices spelled in FakeTokenizer letters.

    With a `row_limit` it breaks as llguidance does when a grammar outgrows one of its limits
    mid-output: accepting a token past that many refuses it, and the matcher stays unusable.
    """

    choices: tuple[str, ...]
    text: str = ""
    history: tuple[str, ...] = ()
    row_limit: int | None = None
    broken: bool = False

    @property
    def is_finished(self) -> bool:
        return self.text in self.choices

    def allowed_token_ids(self) -> frozenset[int]:
        letters = {
            c[len(self.text)] for c in self.choices if c.startswith(self.text) and c != self.text
        }
        allowed = {t for t in range(1, FAKE_VOCAB) if chr(ord("a") + t % 26) in letters}
        return frozenset(allowed | ({FAKE_EOS} if self.is_finished else set()))

    def accept(self, token_ids: Sequence[int]) -> bool:
        for token_id in token_ids:
            if self.row_limit is not None and len(self.history) >= self.row_limit:
                self.broken = True
            if self.broken or token_id not in self.allowed_token_ids():
                return False
            self.history += (self.text,)
            self.text += "" if token_id == FAKE_EOS else chr(ord("a") + token_id % 26)
        return True

    def rollback(self, count: int) -> None:
        if count:
            self.text, self.history = self.history[-count], self.history[:-count]


@dataclass(frozen=True)
class FakeChoiceGrammar:
    choices: tuple[str, ...]
    row_limit: int | None = None

    def matcher(self) -> FakeChoiceMatcher:
        return FakeChoiceMatcher(self.choices, row_limit=self.row_limit)


class FakeGrammarCompiler:
    """Implements GrammarCompiler for FakeTokenizer: choices of lowercase words only; any other
    spec is a 400 naming its field. `compiled` counts the compiles that reached it.

    Choices longer than `row_limit` letters compile, as such a grammar passes admission, and
    their matchers break after that many tokens (see FakeChoiceMatcher).
    """

    def __init__(self, row_limit: int | None = None) -> None:
        self.compiled = 0
        self._row_limit = row_limit

    def compile(self, spec: GrammarSpec) -> FakeChoiceGrammar:
        self.compiled += 1
        choices = json.loads(spec.source) if spec.kind is GrammarKind.CHOICE else None
        if choices is None or not all(c.isalpha() and c.islower() for c in choices):
            raise InvalidRequestError("the fake compiles lowercase choices only", param=spec.param)
        return FakeChoiceGrammar(tuple(choices), self._row_limit)


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

    def settled(self, timeout: float = 10.0) -> bool:
        """Waits until the last reported occupancy is empty (nothing running or waiting, every
        KV block free); the engine reports after the step that freed them, from its thread."""
        deadline = time.monotonic() + timeout
        while self.state != SchedulerState() and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.state == SchedulerState()


class ManualClock:
    """A monotonic clock in seconds that moves only when a test sets or advances it."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


if TYPE_CHECKING:  # mypy holds the fakes to the ports they stand in for
    _EXECUTOR: type[ModelExecutor] = FakeExecutor
    _TOKENIZER: type[Tokenizer] = FakeTokenizer
    _COMPILER: type[GrammarCompiler] = FakeGrammarCompiler
    _GRAMMAR: type[CompiledGrammar] = FakeChoiceGrammar
    _MATCHER: type[GrammarMatcher] = FakeChoiceMatcher
