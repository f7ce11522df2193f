"""Serve settings carried from `helios serve` to the gunicorn worker through one variable."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

from adapters.gpu.distributed.launch import ParallelLaunch
from adapters.gpu.factory import RunnerSettings
from domain.parsers.settings import ParserSettings, ReasoningStrings, grammar_in_reasoning
from domain.speculation.drafts import SpeculativeConfig

ENVIRONMENT_VARIABLE = "HELIOS_SERVE_CONFIG"


@dataclass(frozen=True)
class ServeConfig:
    """Everything a worker needs to load and serve the model."""

    model: str | None = None
    served_model_name: str | None = None
    api_key: str | None = None
    max_num_batched_tokens: int = 512
    max_logprobs: int = 20
    # `--speculative-config` as JSON (domain.speculation.drafts.SpeculativeConfig.to_json), or None.
    speculative_config: str | None = None
    runner: RunnerSettings = field(default_factory=RunnerSettings)
    parallel: ParallelLaunch = field(default_factory=ParallelLaunch)
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False
    # `--reasoning-config` as JSON (reasoning_start_str, reasoning_end_str), or None.
    reasoning_config: str | None = None
    # `--structured-outputs-config` as JSON (enable_in_reasoning), or None.
    structured_outputs_config: str | None = None
    # `--api-server-count`: HTTP processes. Above 1 they share one engine process, which
    # listens at `engine_address` (a unix socket).
    api_server_count: int = 1
    engine_address: str | None = None
    # `--api-server-nice`: with several API processes, how much lower their CPU priority is than
    # the engine process's (a nice increment, adapters/cli/priority.py); 0 keeps it equal.
    api_server_nice: int = 5
    # `--async-scheduling`: the overlapped engine loop (domain.engine.engine.EngineConfig).
    async_scheduling: bool = False
    # `--enable-prefix-caching` with `--prefix-caching-hash-algo`: the hash, or None (off).
    prefix_caching: str | None = "sha256"
    # Seconds an API process waits for the engine process to load its model and listen.
    engine_wait_s: float = 300.0

    @property
    def speculative(self) -> SpeculativeConfig | None:
        if self.speculative_config is None:
            return None
        return SpeculativeConfig.from_json(self.speculative_config)

    @property
    def parsers(self) -> ParserSettings:
        strings = (
            ReasoningStrings.from_json(self.reasoning_config)
            if self.reasoning_config is not None
            else ReasoningStrings()
        )
        return ParserSettings(
            self.reasoning_parser,
            self.tool_call_parser,
            self.enable_auto_tool_choice,
            strings,
            reasoning_configured=self.reasoning_config is not None,
            grammar_in_reasoning=(
                self.structured_outputs_config is not None
                and grammar_in_reasoning(self.structured_outputs_config)
            ),
        )

    def to_environment(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_environment(cls) -> ServeConfig:
        raw = os.environ.get(ENVIRONMENT_VARIABLE)
        if not raw:
            return cls()
        values = json.loads(raw)
        runner = RunnerSettings(**values.pop("runner"))
        parallel = ParallelLaunch(**values.pop("parallel", {}))
        return cls(runner=runner, parallel=parallel, **values)
