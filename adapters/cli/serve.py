"""`helios serve`: gunicorn with the Falcon ASGI app on its native asyncio worker."""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import shutil
import signal
import tempfile
import threading
from dataclasses import replace
from typing import Any

from gunicorn.app.base import BaseApplication

from adapters.cli.engine_supervisor import AUTHKEY_VARIABLE, EngineProcess
from adapters.cli.listening import claim_port, gunicorn_listening
from adapters.cli.preflight import PreflightError, check_models
from adapters.cli.runner_args import (
    add_runner_arguments,
    parallel_launch,
    prefix_caching,
    runner_settings,
)
from adapters.cli.serve_config import ENVIRONMENT_VARIABLE, ServeConfig
from adapters.metrics.registry import (
    MULTIPROCESS_VARIABLE,
    clear_multiprocess_directory,
    enable_multiprocess,
    forget_process,
)
from domain.parsers.parsed import REASONING_PARSERS, TOOL_CALL_PARSERS
from domain.parsers.settings import ReasoningStrings, grammar_in_reasoning

_log = logging.getLogger(__name__)
# After the engine process ends, the API processes answer 503 this long before the server stops.
ENGINE_GRACE_S = 2.0


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("serve", help="serve the OpenAI-compatible API")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--api-key", default=os.environ.get("HELIOS_API_KEY"))
    parser.add_argument(
        "--max-logprobs",
        type=int,
        default=20,
        help="largest logprobs/top_logprobs a request may ask (never above K)",
    )
    parser.add_argument(
        "--api-server-count",
        type=_positive,
        default=1,
        metavar="N",
        help="HTTP processes (vLLM's flag). 1 runs the engine inside the one HTTP process; "
        "N > 1 runs one engine process (which owns the model) and N HTTP processes that reach "
        "it over a unix socket, with metrics in multiprocess mode and the Responses store in "
        "the engine process",
    )
    parser.add_argument(
        "--api-server-nice",
        type=_nice,
        default=5,
        metavar="INCREMENT",
        help="with --api-server-count above 1, how much lower the HTTP processes' CPU priority "
        "is than the engine process's (a nice increment, 0-19; 0 keeps them equal): where "
        "cores are short the engine keeps the device fed first",
    )
    parser.add_argument(
        "--async-scheduling",
        action="store_true",
        help="overlap the host with the model (vLLM's flag): the engine plans and submits each "
        "step before it reads the one in flight, which runs on its own thread; steps with "
        "speculation, grammars, a thinking budget or prompt scoring stay synchronous",
    )
    parser.add_argument(
        "--timeout",
        type=int,
        default=300,
        help="gunicorn worker timeout in seconds (model load included)",
    )
    _add_parser_arguments(parser)
    add_runner_arguments(parser, model_positional="model_path")
    parser.set_defaults(run=run)


def _add_parser_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--reasoning-parser",
        choices=REASONING_PARSERS,
        default=None,
        help="split <think> reasoning out of chat answers (reasoning_content)",
    )
    parser.add_argument(
        "--tool-call-parser",
        choices=TOOL_CALL_PARSERS,
        default=None,
        help="parse <tool_call> JSON in chat answers into tool_calls",
    )
    parser.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help='serve tool_choice "auto": the model may answer or call tools',
    )
    parser.add_argument(
        "--reasoning-config",
        type=_reasoning_config,
        default=None,
        help='JSON {"reasoning_start_str": ..., "reasoning_end_str": ...} (default <think>, '
        "</think>); the end string is what thinking_token_budget forces",
    )

    parser.add_argument(
        "--structured-outputs-config",
        type=_structured_outputs_config,
        default=None,
        help='JSON {"enable_in_reasoning": true} makes a grammar constrain the reasoning too '
        "(by default it starts after the reasoning parser's end string)",
    )


def _nice(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 0 <= value <= 19:
        raise argparse.ArgumentTypeError(f"{value} is not a nice increment from 0 to 19")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not at least 1")
    return value


def _structured_outputs_config(text: str) -> str:
    try:
        grammar_in_reasoning(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def _reasoning_config(text: str) -> str:
    try:
        ReasoningStrings.from_json(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


class _Gunicorn(BaseApplication):
    """Runs gunicorn in this process with settings from the command line, no config file."""

    def __init__(self, options: dict[str, object]) -> None:
        self._options = options
        super().__init__()

    def load_config(self) -> None:
        for name, value in self._options.items():
            self.cfg.set(name, value)

    def load(self):
        from adapters.cli.asgi import create_app

        return create_app()


# Flags that ServeConfig holds under their own names, as parsed.
_SAME_NAMES = (
    "served_model_name",
    "api_key",
    "max_num_batched_tokens",
    "max_logprobs",
    "reasoning_parser",
    "tool_call_parser",
    "enable_auto_tool_choice",
    "reasoning_config",
    "structured_outputs_config",
    "api_server_count",
    "api_server_nice",
    "async_scheduling",
)


def _child_exit(server: object, worker: Any) -> None:
    forget_process(worker.pid)


def run(args: argparse.Namespace) -> int:
    config = ServeConfig(
        model=args.model_path or args.model,
        speculative_config=(
            args.speculative_config.to_json() if args.speculative_config is not None else None
        ),
        runner=runner_settings(args),
        parallel=parallel_launch(args),
        prefix_caching=prefix_caching(args),
        engine_wait_s=float(args.timeout),
        **{name: getattr(args, name) for name in _SAME_NAMES},
    )
    try:
        config.parsers  # noqa: B018 -- checks the flags together before gunicorn starts
    except ValueError as error:
        raise SystemExit(f"helios serve: {error}") from None
    try:
        # Before gunicorn or the engine process: a model that cannot load stops here, in one
        # line, rather than as a worker's traceback and gunicorn's "Worker failed to boot".
        check_models(config.model, config.runner, config.speculative)
    except PreflightError as error:
        raise SystemExit(f"helios serve: error: {error}") from None
    try:
        port = claim_port(args.host, args.port)
    except OSError as error:
        where = f"{args.host}:{args.port}"
        raise SystemExit(f"helios serve: error: cannot listen on {where}: {error}") from None
    options = _gunicorn_options(args, port, workers=config.api_server_count)
    if config.api_server_count > 1:
        return _run_with_engine_process(config, options)
    os.environ[ENVIRONMENT_VARIABLE] = config.to_environment()
    clear_multiprocess_directory()
    _Gunicorn(options).run()
    return 0


def _gunicorn_options(args: argparse.Namespace, port: int, workers: int) -> dict[str, object]:
    return {
        **gunicorn_listening(args.host, port, workers),
        "worker_class": "asgi",
        "workers": workers,
        "timeout": args.timeout,
        "graceful_timeout": 10,
        "preload_app": False,
        "accesslog": "-",
        # One control socket per user would make two servers on one machine fight over it.
        "control_socket_disable": True,
        "child_exit": _child_exit,
    }


def _run_with_engine_process(config: ServeConfig, options: dict[str, object]) -> int:
    """One engine process and N gunicorn workers that reach it.

    The metrics go to multiprocess files (a fresh directory unless PROMETHEUS_MULTIPROC_DIR
    names one), so that any worker's /metrics adds up every process. If the engine process
    ends, the workers answer 503 and the server stops, as vLLM's does, for a supervisor to
    start it again.
    """
    metrics_directory = None
    if not os.environ.get(MULTIPROCESS_VARIABLE):
        metrics_directory = tempfile.mkdtemp(prefix="helios-metrics-")
    enable_multiprocess(os.environ.get(MULTIPROCESS_VARIABLE) or str(metrics_directory))
    clear_multiprocess_directory()
    directory, address = EngineProcess.socket_address()
    os.environ[ENVIRONMENT_VARIABLE] = replace(config, engine_address=address).to_environment()
    os.environ[AUTHKEY_VARIABLE] = secrets.token_hex(32)
    engine = EngineProcess.start(directory)
    engine_ended = threading.Event()
    stopping = threading.Event()

    def on_engine_exit() -> None:
        if stopping.is_set():
            return
        engine_ended.set()
        _log.critical("the engine process ended; helios serve stops in %.0f s", ENGINE_GRACE_S)
        # The arbiter stops gracefully on SIGTERM; meanwhile the workers answer 503.
        timer = threading.Timer(ENGINE_GRACE_S, os.kill, (os.getpid(), signal.SIGTERM))
        timer.daemon = True
        timer.start()

    engine.watch(on_engine_exit)
    status: object = 0
    try:
        _Gunicorn(options).run()
    except SystemExit as stopped:  # the arbiter ends with sys.exit, even when all went well
        status = stopped.code
    finally:
        stopping.set()
        engine.stop()
        if metrics_directory is not None:
            shutil.rmtree(metrics_directory, ignore_errors=True)
    if engine_ended.is_set() and not status:
        return 1
    return status if isinstance(status, int) else 1
