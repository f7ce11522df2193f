"""Serve settings carried from `helios serve` to the gunicorn worker through one variable."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

from adapters.gpu.factory import RunnerSettings
from adapters.gpu.parallel.launch import ParallelLaunch
from domain.speculation import SpeculativeConfig

ENVIRONMENT_VARIABLE = "HELIOS_SERVE_CONFIG"


@dataclass(frozen=True)
class ServeConfig:
    """Everything a worker needs to load and serve the model."""

    model: str | None = None
    served_model_name: str | None = None
    api_key: str | None = None
    max_num_batched_tokens: int = 512
    max_logprobs: int = 20
    # `--speculative-config` as JSON (domain.speculation.SpeculativeConfig.to_json), or None.
    speculative_config: str | None = None
    runner: RunnerSettings = field(default_factory=RunnerSettings)
    parallel: ParallelLaunch = field(default_factory=ParallelLaunch)

    @property
    def speculative(self) -> SpeculativeConfig | None:
        if self.speculative_config is None:
            return None
        return SpeculativeConfig.from_json(self.speculative_config)

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
