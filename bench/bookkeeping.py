"""One step's host work for logprobs, in process: frame read, emission, presentation, SSE JSON.

Run: `.venv/bin/python bench/bookkeeping.py [--steps N] [--lanes 60,8] [--profile]`.

Each measured step is what the host does for one decode step of L streaming lanes, one token
each, with the production classes and the real SmolLM2 tokenizer (the embedded default model):
- executor: `CompletionOutputs.upload`, `commit` and `read` of a frame whose logprob words the
  bench wrote in the packed layout beforehand (valid token IDs, FP32 values, as a reduction
  would leave them; writing them is the device's work and is not timed);
- emission: each lane's `ChoiceEmission.advance` over its record and decoded positions;
- present+JSON: each lane's completions (or chat) logprobs object as the HTTP app builds it
  (chat's written as JSON text from token templates, `adapters/http/logprob_json`), its stream
  chunk, and the `data:` frame serialized as the app serializes SSE.
It runs logprobs off, K=0 and K=20 in the same process and prints per-step milliseconds (median
of the steps) and each mode's ratio to logprobs off. `--profile` adds the top cProfile costs of
the K=20 steps at the largest lane count.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import falcon
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.gpu.loading.default_model import default_gguf_path, exported_model_dir  # noqa: E402
from adapters.gpu.logprobs.completion_outputs import CompletionOutputs  # noqa: E402
from adapters.http.app import create_app  # noqa: E402
from adapters.http.logprob_json import LogprobJson  # noqa: E402
from adapters.http.serving import ModelHolder  # noqa: E402
from adapters.http.sse import json_event  # noqa: E402
from adapters.tokenizer.hf import HfTokenizer  # noqa: E402
from domain.contract.capabilities import FULL_LOGPROBS  # noqa: E402
from domain.contract.geometry import ExecutorGeometry  # noqa: E402
from domain.contract.records import CompletionRecord, Role  # noqa: E402
from domain.emission.choice import ChoiceEmission  # noqa: E402
from domain.engine.step import SlotWork  # noqa: E402
from domain.logprobs.values import LogprobOptions  # noqa: E402
from domain.presentation.logprobs import TokenRendering, completion_logprobs  # noqa: E402
from domain.presentation.objects import ResponseHeader, chat_chunk, completion_chunk  # noqa: E402
from domain.requests.choice_sampling import LaneSampling  # noqa: E402
from domain.requests.sampling import SamplingParams  # noqa: E402

CAPACITY = 64
TOKEN_CAPACITY = 8  # the default T
TEXT = (
    "The quick brown fox jumps over the lazy dog. Helios serves exact logprobs: every value on "
    "the wire is the FP32 number the device wrote, widened, and the alternatives come in order. "
    "Fruits such as apples, pears and plums are good because they are sweet and keep well. "
)
MODES: tuple[tuple[str, LogprobOptions | None], ...] = (
    ("off", None),
    ("K=0", LogprobOptions(top_k=0)),
    ("K=20", LogprobOptions(top_k=20)),
)


@dataclass
class Phases:
    executor: list[float]
    emission: list[float]
    present: list[float]

    def medians(self) -> tuple[float, float, float]:
        def ms(part: list[float]) -> float:
            return statistics.median(part) * 1e3

        return ms(self.executor), ms(self.emission), ms(self.present)


class StepBench:
    """L lanes of one mode over one `CompletionOutputs`, each a streaming choice of its own."""

    def __init__(
        self,
        tokenizer: HfTokenizer,
        lanes: int,
        options: LogprobOptions | None,
        chat: bool,
        sse_serialize: Callable[[dict], bytes],
        writer: LogprobJson,
        rendering: TokenRendering,
    ) -> None:
        self._tokenizer = tokenizer
        self._options = options
        self._chat = chat
        self._serialize = sse_serialize
        vocab = tokenizer.vocab_size
        geometry = ExecutorGeometry(
            capacity=CAPACITY,
            block_size=16,
            num_blocks=1024,
            vocab_size=vocab,
            max_model_len=4096,
            token_capacity=TOKEN_CAPACITY,
            logprobs=FULL_LOGPROBS,
        )
        self._outputs = CompletionOutputs(geometry, torch.device("cpu"), "reference")
        self._text = tokenizer.encode(TEXT, add_special_tokens=False)
        self._rng = random.Random(1)
        params = SamplingParams(max_tokens=100_000)
        self._lanes = list(range(lanes))
        self._works = [
            SlotWork(
                slot=slot,
                epoch=1,
                token_ids=(self._text[0],),
                start_position=10,
                block_table=(slot,),
                prompt_len=5,
                sample=True,
                sampling=LaneSampling(params, slot, remaining=100_000, logprobs=options),
            )
            for slot in self._lanes
        ]
        self._choices = [
            ChoiceEmission(0, params, tokenizer, logprobs=options is not None) for _ in self._lanes
        ]
        # The server keeps one rendering and one writer (memos of names, bytes and token
        # templates) for all requests.
        self._writer = writer
        self._rendering = rendering
        self._header = ResponseHeader("cmpl-0123456789abcdef0123456789abcdef", 1764633600, "m")
        self._vocab = vocab
        self._step = 0
        self.phases = Phases([], [], [])
        self.profiler: cProfile.Profile | None = None

    def _write_frame(self, frame: int, chosen: list[int]) -> None:
        """What a reduction leaves in the frame: per lane its chosen pair at position 0 and 20
        alternatives (distinct IDs, descending FP32 values); the device's work, not timed."""
        buffers = self._outputs.buffers
        assert buffers is not None
        words = buffers.logprobs[frame]
        values = words.view(torch.float32)
        for slot, token_id in zip(self._lanes, chosen, strict=True):
            ids = [token_id, *self._alternative_ids()]
            logprobs = sorted((-self._rng.expovariate(0.3) for _ in range(21)), reverse=True)
            words[slot, 0, 0] = token_id
            values[slot, 0, 1] = logprobs[self._rng.randrange(21)]
            words[slot, 0, 2:42:2] = torch.tensor(ids[1:], dtype=torch.int32)
            values[slot, 0, 3:43:2] = torch.tensor(logprobs[1:], dtype=torch.float32)

    def _alternative_ids(self) -> list[int]:
        """Twenty distinct IDs, log-uniform over the vocabulary: a model's alternatives are
        mostly the frequent (low-ID) merges, with a long tail."""
        found: dict[int, None] = {}
        while len(found) < 20:
            found[int(self._vocab ** self._rng.random()) - 1] = None
        return list(found)

    def step(self) -> None:
        frame = self._step % 2
        chosen = [self._text[(self._step + lane * 7) % len(self._text)] for lane in self._lanes]
        self._step += 1
        records = [
            CompletionRecord(
                slot=slot,
                epoch=1,
                role=Role.SAMPLE,
                tokens=(token_id,),
                first_position=10 + self._step,
                generated_total=self._step,
            )
            for slot, token_id in zip(self._lanes, chosen, strict=True)
        ]
        outputs = self._outputs
        start = time.perf_counter()
        requested = outputs.upload(frame, self._works)
        paused = time.perf_counter()
        if requested:
            # The device's part: kept out of the timings and of the profile.
            if self.profiler is not None:
                self.profiler.disable()
            self._write_frame(frame, chosen)
            if self.profiler is not None:
                self.profiler.enable()
        resumed = time.perf_counter()
        outputs.commit(frame, records)
        result = outputs.read(frame)
        read = time.perf_counter()
        deltas = [
            choice.advance(record, result.lane_logprobs(lane))
            for lane, (choice, record) in enumerate(zip(self._choices, result.records, strict=True))
        ]
        emitted = time.perf_counter()
        for delta in deltas:
            self._serialize(self._chunk(delta))
        done = time.perf_counter()
        self.phases.executor.append((paused - start) + (read - resumed))
        self.phases.emission.append(emitted - read)
        self.phases.present.append(done - emitted)

    def _chunk(self, delta) -> dict:
        options = self._options
        if options is None:
            logprobs = None
        elif self._chat:
            logprobs = self._writer.chat(delta.logprobs, options)
        else:
            logprobs = completion_logprobs(delta.logprobs, options, self._rendering)
        if self._chat:
            content = {"content": delta.text} if delta.text else {}
            return chat_chunk(self._header, 0, content, logprobs=logprobs)
        return completion_chunk(self._header, 0, delta.text, logprobs=logprobs)


def sse_serializer() -> Callable[[dict], bytes]:
    """The `data:` frame of a chunk as the app writes it: the app's own JSON media handler."""
    app = create_app(ModelHolder())
    handler, _, _ = app.resp_options.media_handlers._resolve(falcon.MEDIA_JSON, falcon.MEDIA_JSON)

    def serialize(chunk: dict) -> bytes:
        return json_event(chunk).serialize(handler)

    return serialize


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=120, help="measured steps per row")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured steps first")
    parser.add_argument("--lanes", default="60,8", help="comma-separated lane counts")
    parser.add_argument("--profile", action="store_true", help="cProfile K=20 at the most lanes")
    args = parser.parse_args()
    tokenizer = HfTokenizer.from_dir(exported_model_dir(default_gguf_path(), progress=False))
    serialize = sse_serializer()
    rendering = TokenRendering(tokenizer.token_bytes)
    writer = LogprobJson(rendering)
    torch.set_num_threads(1)
    lane_counts = [int(part) for part in args.lanes.split(",")]
    print(
        f"SmolLM2 tokenizer (vocab {tokenizer.vocab_size}), T={TOKEN_CAPACITY}, "
        f"{args.steps} steps per row after {args.warmup} warm-up, median ms per step\n"
    )
    print(
        "| endpoint | lanes | logprobs | executor ms | emission ms | present+JSON ms | total ms "
        "| us/lane | x off |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for chat in (False, True):
        for lanes in lane_counts:
            baseline = None
            for name, options in MODES:
                bench = StepBench(tokenizer, lanes, options, chat, serialize, writer, rendering)
                for _ in range(args.warmup):
                    bench.step()
                bench.phases = Phases([], [], [])
                for _ in range(args.steps):
                    bench.step()
                executor, emission, present = bench.phases.medians()
                total = executor + emission + present
                baseline = baseline or total
                endpoint = "chat" if chat else "completions"
                print(
                    f"| {endpoint} | {lanes} | {name} | {executor:.2f} | {emission:.2f} | "
                    f"{present:.2f} | {total:.2f} | {total / lanes * 1e3:.0f} | "
                    f"{total / baseline:.2f}x |"
                )
    if args.profile:
        profile(tokenizer, max(lane_counts), serialize, writer, rendering, args.steps)
    return 0


def profile(
    tokenizer: HfTokenizer,
    lanes: int,
    serialize: Callable[[dict], bytes],
    writer: LogprobJson,
    rendering: TokenRendering,
    steps: int,
) -> None:
    for chat in (False, True):
        bench = StepBench(
            tokenizer, lanes, LogprobOptions(top_k=20), chat, serialize, writer, rendering
        )
        for _ in range(10):
            bench.step()
        profiler = bench.profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(steps):
            bench.step()
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(18)
        endpoint = "chat" if chat else "completions"
        print(f"\ncProfile, {endpoint}, K=20, {lanes} lanes, {steps} steps (by own time):")
        print(out.getvalue().split("\n\n", 2)[-1].rstrip())


if __name__ == "__main__":
    sys.exit(main())
