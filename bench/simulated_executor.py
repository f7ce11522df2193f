"""A model executor that does no model work, for the host-ceiling bench (`bench/host.py`).

Only the device's part of a step is simulated: the forward, the sampling and the logprob
reduction. Everything the host does with a step's outputs is the production code: the logprob
request upload, the ABI6 record frames and the packed logprob frame of `CompletionOutputs`, and
its read-back and decoding. So a server over this executor shows what the host costs when the
device costs nothing (or the fixed `step_s` it is given).

Bench code only: nothing in `domain`, `ports` or `adapters` imports it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from adapters.gpu.lane_records import forced_record, prompt_record, sampled_record
from adapters.gpu.logprobs.completion_outputs import CompletionOutputs
from domain.contract.frames import FrameResult
from domain.contract.geometry import ExecutorGeometry
from domain.contract.records import CompletionRecord
from domain.engine.commit import commit_round
from domain.engine.step import SlotWork, StepPlan
from domain.logprobs.values import float_to_bits
from domain.overlap.late_commit import commits_late, drawn_tokens
from domain.overlap.pending import last_tokens, resolve_pending

# What every lane "generates": this text's tokens, from an offset its seed picks, one position
# after another. Real English keeps the detokenizer and the token strings realistic.
TEXT = (
    "The river bends twice before it reaches the old mill, and in spring the water runs high "
    "enough to turn the wheel again. People from the village walk down on Sunday afternoons to "
    "watch it, bringing bread for the ducks and stories about the miller, who kept bees and "
    "argued with everyone about the weather. Nobody remembers when the mill stopped grinding "
    "flour, but the stones are still there, worn smooth in the middle, and children like to "
    "stand on them and pretend they are captains of a ship. In the evening the light turns "
    "gold over the fields, the swallows fly low, and the sound of the wheel follows you all "
    "the way back up the hill. "
)

_NAN = float_to_bits(float("nan"))


@dataclass(frozen=True)
class _Launched:
    """A step on the simulated device: its plan, each drawing lane's text index, and when the
    step ends."""

    frame: int
    plan: StepPlan
    drawn: list[tuple[SlotWork, int]]
    deadline: float


@dataclass
class BookkeepingTally:
    """What the executor's host side spent: steps, their sampling lanes, emitted tokens,
    positions that asked for logprobs, and the CPU seconds of `submit` and `read`.

    Seconds are the calling thread's CPU time, so neither the simulated device wait nor
    waiting for the GIL counts. The `wide_` fields count only steps of at least `wide_lanes`
    sampling lanes, where the issue quotes the per-step bookkeeping cost.
    """

    steps: int = 0
    lanes: int = 0
    tokens: int = 0
    requesting: int = 0
    # Frames submitted and not yet read: their sampling lanes and submit CPU seconds.
    _pending: dict[int, tuple[int, float]] = field(default_factory=dict, repr=False)
    submit_s: float = 0.0
    read_s: float = 0.0
    wide_lanes: int = 56
    wide_steps: int = 0
    wide_s: float = 0.0

    def submitted(self, frame: int, lanes: int, requesting: int, cpu_s: float) -> None:
        self._pending[frame] = (lanes, cpu_s)
        self.steps += 1
        self.lanes += lanes
        self.requesting += requesting
        self.submit_s += cpu_s

    def committed(self, tokens: int) -> None:
        self.tokens += tokens

    def settled(self, frame: int, cpu_s: float) -> None:
        """A late commit is its submission's host work, wherever it runs."""
        lanes, submit_s = self._pending.get(frame, (0, 0.0))
        self._pending[frame] = (lanes, submit_s + cpu_s)
        self.submit_s += cpu_s

    def read(self, frame: int, cpu_s: float) -> None:
        lanes, submit_s = self._pending.pop(frame, (0, 0.0))
        self.read_s += cpu_s
        if lanes >= self.wide_lanes:
            self.wide_steps += 1
            self.wide_s += submit_s + cpu_s

    def snapshot(self) -> dict[str, float]:
        """The counters as plain numbers (JSON for the bench server's stats route)."""
        return {name: value for name, value in vars(self).items() if name != "_pending"}


class SimulatedExecutor:
    """Implements `ports.executor.ModelExecutor` with no model: each sampling lane emits the
    next token of `text_ids` (from an offset its seed picks, so a seeded lane emits the same
    tokens whatever else is in the batch), and a requesting lane's packed logprob words are
    copied from a table made at construction, as a device's reduction would write them.

    The step's host work is the production `CompletionOutputs` (upload, commit, read) and the
    shared commit rule, in the torch executor's order. `step_s` stands for the device: after
    the upload the simulated device draws each lane's token and writes the logprob words, and
    the step ends `step_s` after it started; whoever needs its tokens waits until then, as the
    torch executor waits for its sampled tokens (a real device's draw and reduction run inside
    its step and cost the host nothing). A plan that `commits_late` is committed after the
    next submission is launched, or when its frame is settled, as the torch executor does.
    Drafts and grammars are refused (a whole-step failure): the bench serves neither.
    """

    def __init__(
        self,
        geometry: ExecutorGeometry,
        text_ids: Sequence[int],
        step_s: float = 0.0,
        *,
        sleep: Callable[[float], None] = time.sleep,
        cpu_clock: Callable[[], float] = time.thread_time,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not text_ids or any(not 0 <= t < geometry.vocab_size for t in text_ids):
            raise ValueError("the simulated text needs token IDs inside the vocabulary")
        if step_s < 0:
            raise ValueError(f"the simulated device step must be non-negative, got {step_s}")
        self._geometry = geometry
        self._text = tuple(text_ids)
        self._step_s = step_s
        self._sleep = sleep
        self._cpu_clock = cpu_clock
        self._clock = clock
        device = torch.device("cpu")
        self._outputs = CompletionOutputs(geometry, device, "reference")
        self._top_k = geometry.logprobs.top_k
        self._words = _position_words(self._text, self._top_k).numpy()
        self._next_frame = 0
        # What a plan made ahead feeds: the previous submission's last tokens by (slot, epoch).
        self._feeds: dict[tuple[int, int], int] = {}
        # A submission launched and not yet committed (`commits_late`), then landed.
        self._late: _Launched | None = None
        self._landed: _Launched | None = None
        self.tally = BookkeepingTally()

    @property
    def geometry(self) -> ExecutorGeometry:
        return self._geometry

    def submit(self, plan: StepPlan) -> int:
        cpu = self._cpu_clock()
        frame = self._next_frame
        self._next_frame ^= 1
        # The previous step ends on the device: this one's placeholders feed its draws.
        self.land()
        late, self._landed = self._landed, None
        feeds, self._feeds = self._feeds, {}
        if late is not None:
            feeds = self._drawn(late)
        try:
            plan = resolve_pending(plan, feeds)
            if plan.scored:
                raise ValueError("the simulated executor scores no prompts")
            for work in plan.works:
                if work.slot >= self._geometry.capacity:
                    raise ValueError(
                        f"slot {work.slot} is outside the capacity {self._geometry.capacity}"
                    )
                if work.speculation is not None or work.grammar is not None:
                    raise ValueError(
                        "the simulated executor verifies no drafts and masks no grammar"
                    )
            emitting = [work for work in plan.works if work.sample]
            if emitting:
                self._outputs.upload(frame, emitting)
            launched = self._launch(frame, plan)
        finally:
            # The host's commit of the previous step, while the device runs this one.
            if late is not None:
                self._commit(late)
        if launched.drawn and commits_late(plan):
            self._late = launched
        else:
            self._wait(launched.deadline)
            self._feeds = last_tokens(self._commit(launched))
        requesting = sum(1 for work, _ in launched.drawn if work.sampling.logprobs is not None)
        cpu_s = self._cpu_clock() - cpu
        self.tally.submitted(frame, len(emitting), requesting, cpu_s)
        return frame

    def land(self) -> int | None:
        """Waits for a late step to end on the device, as the torch executor does; its frame,
        or None."""
        late, self._late = self._late, None
        if late is not None:
            self._wait(late.deadline)
            self._landed = late
        return self._landed.frame if self._landed is not None else None

    def settle(self, frame: int) -> None:
        """Commits `frame` if its submission left the commit for later, as the torch
        executor does."""
        # Each field read once: under `BackgroundExecutor` the engine thread's `read` calls
        # this for a frame the worker has settled, while the worker may be landing the next.
        late = self._late
        if late is not None and late.frame == frame:
            self.land()
        late = self._landed
        if late is None or late.frame != frame:
            return
        cpu = self._cpu_clock()
        self._landed = None
        self._feeds = self._drawn(late)
        self._commit(late)
        self.tally.settled(frame, self._cpu_clock() - cpu)

    def _drawn(self, late: _Launched) -> dict[tuple[int, int], int]:
        return drawn_tokens(late.plan, (self._text[index] for _, index in late.drawn))

    def read(self, frame: int) -> FrameResult:
        self.settle(frame)
        cpu = self._cpu_clock()
        result = self._outputs.read(frame)
        self.tally.read(frame, self._cpu_clock() - cpu)
        return result

    def _launch(self, frame: int, plan: StepPlan) -> _Launched:
        """The device's part of a step: each lane's draw and the logprob words its reduction
        leaves, done now; the step ends `step_s` after it started."""
        started = self._clock()
        drawn = self._draw(plan)
        requesting = [row for row in drawn if row[0].sampling.logprobs is not None]
        if requesting:
            self._write_logprobs(frame, requesting)
        return _Launched(frame, plan, drawn, started + self._step_s)

    def _wait(self, deadline: float) -> None:
        """Waits for the device's step to end, as the torch executor waits for its tokens."""
        if self._step_s:
            self._sleep(max(0.0, deadline - self._clock()))

    def _draw(self, plan: StepPlan) -> list[tuple[SlotWork, int]]:
        """The device's draw: (lane, text index of its token) of every lane that samples, in
        plan order; a forced lane draws nothing."""
        return [
            (work, (work.sampling.seed + work.first_emitted_position) % len(self._text))
            for work in plan.works
            if work.sample and work.forced_token is None
        ]

    def _commit(self, launched: _Launched) -> list[CompletionRecord]:
        """One record per lane, by the shared commit rule over the drawn tokens, into its
        frame."""
        records = []
        draws = iter(launched.drawn)
        for work in launched.plan.works:
            if not work.sample:
                records.append(prompt_record(work))
            elif work.forced_token is not None:
                records.append(forced_record(work))
            else:
                _, index = next(draws)
                emitted, finish, _ = commit_round(work, (self._text[index],))
                records.append(sampled_record(work, emitted, finish))
        self._outputs.commit(launched.frame, records)
        self.tally.committed(sum(len(record.tokens) for record in records))
        return records

    def _write_logprobs(self, frame: int, drawn: list[tuple[SlotWork, int]]) -> None:
        """What the device reduction would leave in the frame: each drawn position's chosen
        pair and K natural alternatives in one indexed copy; selected IDs lane by lane.

        Written through numpy views of the (CPU) frame, which keep the GIL: a device's
        reduction takes no host time, and torch's indexed copies here gave the GIL away four
        times a step, each a wait for the worker to get it back from the engine thread.
        """
        buffers = self._outputs.buffers
        if buffers is None:
            raise ValueError("a lane requests logprobs, but the core reports none")
        out = buffers.logprobs[frame].numpy()
        natural = [(work.slot, index) for work, index in drawn if not _selects(work)]
        if natural:
            slots = [slot for slot, _ in natural]
            indices = [index for _, index in natural]
            width = self._words.shape[1]
            out[slots, 0, :width] = self._words[indices]
        for work, index in drawn:
            if _selects(work):
                words = self._selected_words(work, index)
                out[work.slot, 0, : len(words)] = words

    def _selected_words(self, work: SlotWork, index: int) -> list[int]:
        """The chosen pair, then each selected ID in caller order with a made-up value (NaN
        bits past the real vocabulary, as the reducer reports them)."""
        words = self._words[index, :2].tolist()
        ids = work.sampling.logprobs.token_ids if work.sampling.logprobs is not None else ()
        for token_id in ids:
            inside = token_id < self._geometry.vocab_size
            words += [token_id, float_to_bits(-4.0 - 0.01 * (token_id % 97)) if inside else _NAN]
        return words


def _selects(work: SlotWork) -> bool:
    options = work.sampling.logprobs
    return options is not None and options.selects


def _position_words(text: tuple[int, ...], top_k: int) -> torch.Tensor:
    """Packed words [len(text), 2 + 2K] for the chosen token at each text index: its logprob,
    then K alternatives in reported order (descending value; the chosen token ranks first)."""
    distinct = sorted(set(text))
    rows = []
    for index, token_id in enumerate(text):
        chosen = -0.05 - 0.9 * ((index * 0.6180339887) % 1.0)
        words = [token_id, float_to_bits(chosen)]
        others = [t for t in distinct if t != token_id]
        alternatives = [token_id] + [others[(index + r) % len(others)] for r in range(top_k - 1)]
        for rank, alternative in enumerate(alternatives[:top_k]):
            words += [alternative, float_to_bits(chosen - 1.5 * bool(rank) - 0.35 * rank)]
        rows.append(words)
    return torch.tensor(rows, dtype=torch.int32).reshape(len(text), 2 + 2 * top_k)
