"""The engine process's own ceiling: `Engine.step` in this process over the simulated executor.

Run: `.venv/bin/python bench/host_engine.py [--streams 64] [--step-ms 7] [--variants 0,20]
[--scheduling sync,async] [--steps 500] [--rounds 3]`.

What `bench/host.py` serves, without HTTP, API processes or clients: the production engine,
emission and `CompletionOutputs` over `bench/simulated_executor.py`, the Prometheus metrics in
multiprocess mode as the engine process keeps them, and under `async` the overlapped loop
(`BackgroundExecutor`, the 0.5 ms GIL turns of `EngineLoop`). `--streams` chat streams of 64
tokens each (greedy, EOS ignored, a new one as each ends) keep every lane busy; after each step
this thread takes the ready outputs off the channels, as the engine socket's writer would. For
each cell it prints the engine thread's CPU a step (median), the process's CPU and the wall time
a step, and the step rate against the ideal 1000 / step-ms: with the device step given, whatever
the rest of the server does, a step cannot be shorter than this process makes it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

WARM_UP_STEPS = 100
PROMPT = "Tell me about the history of the printing press in Europe, please."


@dataclass(frozen=True)
class Cell:
    variant: str
    overlapped: bool
    engine_thread_ms: float  # median over the measured steps
    process_ms: float
    wall_ms: float

    @property
    def steps_per_s(self) -> float:
        return 1000 / self.wall_ms


def run_cell(variant: str, overlapped: bool, args: argparse.Namespace) -> Cell:
    """One engine, `args.steps` measured steps after the warm-up."""
    from host_server import HostSettings, simulated_executor

    from adapters.cli.asgi import METRICS_INTERVAL_S
    from adapters.cli.engine_thread import SWITCH_INTERVAL_S
    from adapters.core.export import CoreSizes, resolve_core
    from adapters.gpu.background_executor import BackgroundExecutor
    from adapters.metrics.prometheus import PrometheusMetrics
    from adapters.tokenizer.hf import HfTokenizer
    from domain.emission.channel import OutputChannel
    from domain.emission.outputs import RequestEnd
    from domain.engine.engine import Engine, EngineConfig
    from domain.logprobs.rules import LogprobAsk
    from domain.requests.engine_request import EngineRequest
    from domain.requests.sampling import SamplingParams

    core = resolve_core(None, CoreSizes(args.streams))
    tokenizer = HfTokenizer.from_dir(core.model_dir)
    config = EngineConfig(
        max_num_seqs=args.streams,
        async_scheduling=overlapped,
        metrics_interval_s=METRICS_INTERVAL_S,
    )
    settings = HostSettings(engine=config, step_ms=args.step_ms)
    executor = simulated_executor(settings, core, tokenizer)
    runner = BackgroundExecutor(executor) if overlapped else executor
    engine = Engine(runner, tokenizer, config, observer=PrometheusMetrics("m", reports_engine=True))
    sys.setswitchinterval(SWITCH_INTERVAL_S if overlapped else 0.005)
    top = None if variant == "off" else int(variant)
    ask = LogprobAsk() if top is None else LogprobAsk(True, top, "top_logprobs", stream=True)
    prompt = tuple(tokenizer.encode(PROMPT, add_special_tokens=False))
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    channels: dict[str, OutputChannel] = {}
    started = 0

    def start_stream() -> None:
        nonlocal started
        started += 1
        request_id = f"stream-{started}"
        channels[request_id] = engine.submit(
            EngineRequest(request_id, prompt, params, logprobs=ask)
        )

    for _ in range(args.streams):
        start_stream()
    thread_ms: list[float] = []
    process_s = wall_s = 0.0
    for step in range(WARM_UP_STEPS + args.steps):
        if step == WARM_UP_STEPS:
            process_s, wall_s = time.process_time(), time.perf_counter()
        entered = time.thread_time()
        engine.step()
        thread_ms.append(1000 * (time.thread_time() - entered))
        for request_id, channel in list(channels.items()):
            ended = False
            while (item := channel.get_nowait()) is not None:
                ended = ended or isinstance(item, RequestEnd)
            if ended:
                del channels[request_id]
                start_stream()
    process_ms = 1000 * (time.process_time() - process_s) / args.steps
    wall_ms = 1000 * (time.perf_counter() - wall_s) / args.steps
    for request_id in channels:
        engine.abort(request_id)
    while engine.has_work():
        engine.step()
    close = getattr(runner, "close", None)
    if close is not None:
        close()
    return Cell(
        variant, overlapped, statistics.median(thread_ms[WARM_UP_STEPS:]), process_ms, wall_ms
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--step-ms", type=float, default=7.0)
    parser.add_argument("--variants", default="0,20")
    parser.add_argument("--scheduling", default="sync,async")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    # The engine process's metrics are multiprocess files; prometheus_client reads this once.
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="helios-metrics-"))
    variants = [v for v in args.variants.split(",") if v]
    modes = [m == "async" for m in args.scheduling.split(",") if m in ("sync", "async")]
    ideal = 1000 / args.step_ms if args.step_ms else None
    print(
        f"bench/host_engine.py: {args.streams} streams, step {args.step_ms:g} ms, "
        f"{args.steps} steps after {WARM_UP_STEPS}, {args.rounds} rounds; "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start\n"
    )
    print(
        "| round | loop | logprobs | engine thread CPU ms/step (median) | process CPU ms/step "
        "| wall ms/step | steps/s | share of the ideal |"
    )
    print("|---|---|---|---|---|---|---|---|")
    cells: dict[tuple[bool, str], list[Cell]] = {}
    for round_index in range(args.rounds):
        order = variants[round_index % len(variants) :] + variants[: round_index % len(variants)]
        for overlapped in modes:
            for variant in order:
                cell = run_cell(variant, overlapped, args)
                cells.setdefault((overlapped, variant), []).append(cell)
                share = f"{cell.steps_per_s / ideal:.0%}" if ideal else "-"
                print(
                    f"| {round_index + 1} | {'async' if overlapped else 'sync'} | {variant} "
                    f"| {cell.engine_thread_ms:.2f} | {cell.process_ms:.2f} | {cell.wall_ms:.2f} "
                    f"| {cell.steps_per_s:.0f} | {share} |",
                    flush=True,
                )
    print("\n| loop | logprobs | steps/s, median (range) | share of the ideal | vs K=0 |")
    print("|---|---|---|---|---|")
    for (overlapped, variant), runs in cells.items():
        rates = [cell.steps_per_s for cell in runs]
        base = cells.get((overlapped, "0"))
        ratio = "-"
        if base:
            ratio = (
                f"{statistics.median(rates) / statistics.median(c.steps_per_s for c in base):.2f}x"
            )
        share = f"{statistics.median(rates) / ideal:.0%}" if ideal else "-"
        print(
            f"| {'async' if overlapped else 'sync'} | {variant} | {statistics.median(rates):.0f} "
            f"({min(rates):.0f}-{max(rates):.0f}) | {share} | {ratio} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
