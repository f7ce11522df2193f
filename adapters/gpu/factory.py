"""Builds a torch executor for a model directory: device, dtype, KV pool sized from a budget."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from adapters.gpu.distributed.collectives import Collectives
from adapters.gpu.distributed.split import RankSplit, split_model
from adapters.gpu.executor import TorchExecutor
from adapters.gpu.loading.weights import load_model
from adapters.gpu.model.config import ModelConfig
from adapters.gpu.model.decoder import DecoderModel
from adapters.gpu.model.invariant import check_row_invariance
from adapters.gpu.model.kv_cache import PagedKVCache
from adapters.gpu.scoring.prompt_score_frames import PromptScoreFrames
from adapters.gpu.speculation.draft_runner import DraftRunner
from adapters.grammar.llguidance_compiler import LlguidanceCompiler
from adapters.tokenizer.hf import HfTokenizer
from domain.cache.blocks import blocks_needed
from domain.contract.capabilities import FULL_LOGPROBS, LogprobCapability
from domain.contract.geometry import ExecutorGeometry
from domain.contract.records import resolve_token_capacity

_CAPACITY_ALIGNMENT = 8
_LOGPROB_BACKENDS = ("auto", "reference", "triton")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True, slots=True)
class RunnerSettings:
    """How to run a model; `None` fields take defaults chosen from the device and the model."""

    device: str = "auto"
    dtype: str = "auto"
    max_num_seqs: int = 16
    max_model_len: int | None = None
    kv_cache_bytes: int | None = None
    block_size: int = 16
    token_capacity: int = 0
    logprobs_backend: str = "auto"
    # Serve prompt scoring (plain model directories; an exported core declares its own).
    prompt_logprobs: bool = False
    # Ranks that share the model (vLLM's --tensor-parallel-size).
    tensor_parallel_size: int = 1
    # Kernels whose every row is computed alike whatever shares the forward (vLLM's
    # VLLM_BATCH_INVARIANT): adapters/gpu/model/invariant.py.
    batch_invariant: bool = False

    def __post_init__(self) -> None:
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda, not {self.device!r}")
        if self.dtype != "auto" and self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be auto or one of {sorted(_DTYPES)}, not {self.dtype!r}")
        if self.logprobs_backend not in _LOGPROB_BACKENDS:
            raise ValueError(
                f"logprobs_backend must be one of {sorted(_LOGPROB_BACKENDS)}, "
                f"not {self.logprobs_backend!r}"
            )
        if self.max_num_seqs < 1 or self.block_size < 1:
            raise ValueError("max_num_seqs and block_size must be positive")
        if self.tensor_parallel_size < 1:
            raise ValueError(
                f"tensor_parallel_size must be positive, got {self.tensor_parallel_size}"
            )
        if self.batch_invariant and self.tensor_parallel_size > 1:
            # The all-reduce sums each element in an order set by its place in the tensor.
            raise ValueError("batch-invariant mode does not support tensor parallelism yet")

    def resolve_device(self, local_rank: int = 0) -> torch.device:
        """The device of the rank with `local_rank` on its machine (cuda:local_rank on GPUs)."""
        if self.device == "auto":
            if torch.cuda.is_available():
                return torch.device("cuda", local_rank)
            return torch.device("cpu")
        if self.device == "cuda":
            return torch.device("cuda", local_rank)
        return torch.device(self.device)

    def resolve_logprobs_backend(self, device: torch.device) -> str:
        """Triton's prepared launches on CUDA; the torch reference elsewhere (same output)."""
        if self.logprobs_backend == "auto":
            return "triton" if device.type == "cuda" else "reference"
        return self.logprobs_backend

    def resolve_dtype(self, device: torch.device) -> torch.dtype:
        if self.dtype == "auto":
            # float32 keeps CPU results comparable to references; bf16 is the CUDA serving format.
            return torch.bfloat16 if device.type == "cuda" else torch.float32
        return _DTYPES[self.dtype]


def resolve_max_model_len(settings: RunnerSettings, config: ModelConfig) -> int:
    """`--max-model-len`, else the model's `max_position_embeddings`, which it may not exceed."""
    max_model_len = settings.max_model_len or config.max_position_embeddings
    if max_model_len > config.max_position_embeddings:
        raise ValueError(
            f"--max-model-len {max_model_len} exceeds the model's "
            f"{config.max_position_embeddings} positions (max_position_embeddings)"
        )
    return max_model_len


def padded_capacity(max_num_seqs: int) -> int:
    return -(-max_num_seqs // _CAPACITY_ALIGNMENT) * _CAPACITY_ALIGNMENT


def _default_kv_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * 0.8)
    return 1 << 30


def _scoring_bytes(capability: LogprobCapability, vocab_size: int, config: ModelConfig) -> int:
    if not capability.scores_prompts:
        return 0
    vocab = min(vocab_size, config.vocab_size)
    return PromptScoreFrames.fixed_bytes(capability.scored_capacities, vocab)


def build_executor(
    model_dir: Path,
    settings: RunnerSettings,
    vocab_size: int,
    *,
    capability: LogprobCapability = FULL_LOGPROBS,
    capacity: int | None = None,
    token_capacity: int | None = None,
    draft_dir: Path | None = None,
    collectives: Collectives | None = None,
    local_rank: int = 0,
    grammars: LlguidanceCompiler | None = None,
    progress: bool = False,
) -> TorchExecutor:
    """Loads the weights and sizes the KV pool; `vocab_size` is the tokenizer's real vocabulary.

    A core fixes the logprob capability (prompt scoring included), the padded slot capacity and
    T; a plain model directory serves the complete bundle (K = 20 natural alternatives plus
    selected IDs), as every export does, with the capacity padded up from `--max-num-seqs`.

    With `collectives` over several ranks this builds that rank's executor: its split of the
    model, a KV pool of as many blocks as every rank (sized by the rank holding the most key/
    value heads), and a whole copy of any draft model. Every rank calls this with the same
    arguments, in step: building runs collectives. `progress` shows the loading bars on stderr.
    """
    device = settings.resolve_device(local_rank)
    if settings.batch_invariant and device.type != "cpu":
        # cuBLAS and the fused attention kernels choose tiles and split-K by shape; the torch
        # path here is invariant on MKL only (docs/batch-invariance.md, "CUDA").
        raise ValueError("--batch-invariant runs on the CPU only for now (--device cpu)")
    dtype = settings.resolve_dtype(device)
    config = ModelConfig.from_dir(model_dir)
    split: RankSplit | None = None
    widest = config
    if collectives is not None and collectives.world_size > 1:
        splits = split_model(config, collectives.world_size, min(vocab_size, config.vocab_size))
        split = splits[collectives.rank]
        widest = max((s.local_config(config) for s in splits), key=lambda c: c.num_key_value_heads)
    capacity = capacity or padded_capacity(settings.max_num_seqs)
    if settings.max_num_seqs > capacity:
        raise ValueError(
            f"--max-num-seqs {settings.max_num_seqs} exceeds the core's slot "
            f"capacity {capacity}; export the core with a larger --max-num-seqs"
        )
    invariant = settings.batch_invariant
    max_model_len = resolve_max_model_len(settings, config)

    def loaded(directory: Path, **parts: Any) -> DecoderModel:
        # The target and its draft alike; an invariant model proves its GEMMs on this machine.
        found = load_model(
            directory,
            dtype=dtype,
            device=device,
            batch_invariant=invariant,
            context_length=max_model_len,
            progress=progress,
            **parts,
        )
        if invariant:
            check_row_invariance(found.gemm_weights())
        return found

    model = loaded(model_dir, split=split, collectives=collectives)
    budget = settings.kv_cache_bytes
    if budget is None:
        # The flag's fixed scoring storage comes out of the default pool, so its cost shows as
        # KV capacity rather than as memory the budget did not plan for.
        budget = _default_kv_bytes(device) - _scoring_bytes(capability, vocab_size, config)
    draft_config = ModelConfig.from_dir(draft_dir) if draft_dir is not None else None
    if draft_config is not None:
        check_draft_vocabulary(draft_config, vocab_size)
        # The draft's cache has the target's blocks, so a block costs both models' bytes.
        per_block = PagedKVCache.bytes_per_block(widest, settings.block_size, dtype)
        per_block += PagedKVCache.bytes_per_block(draft_config, settings.block_size, dtype)
        num_blocks = budget // per_block
    else:
        num_blocks = PagedKVCache.blocks_for_budget(widest, budget, settings.block_size, dtype)
    if num_blocks < blocks_needed(max_model_len, settings.block_size):
        raise ValueError(
            f"a KV budget of {budget} bytes holds {num_blocks * settings.block_size} "
            f"positions, less than one sequence of {max_model_len}; "
            f"lower --max-model-len or raise the KV budget"
        )
    kv_cache = PagedKVCache.allocate(model.config, num_blocks, settings.block_size, dtype, device)
    geometry = ExecutorGeometry(
        capacity=capacity,
        block_size=settings.block_size,
        num_blocks=num_blocks,
        vocab_size=min(vocab_size, config.vocab_size),
        max_model_len=max_model_len,
        token_capacity=resolve_token_capacity(token_capacity or settings.token_capacity),
        logprobs=capability,
        kv_window=kv_window(config, draft_config),
    )
    backend = settings.resolve_logprobs_backend(device)
    draft = None
    if draft_dir is not None and draft_config is not None:
        draft_model = loaded(draft_dir)
        draft_cache = PagedKVCache.allocate(
            draft_config, num_blocks, settings.block_size, dtype, device
        )
        draft = DraftRunner(
            draft_model, draft_cache, geometry.vocab_size, device, model.collectives
        )
    return TorchExecutor(
        model, kv_cache, geometry, device, logprobs_backend=backend, draft=draft, grammars=grammars
    )


def kv_window(*configs: ModelConfig | None) -> int | None:
    """The widest sliding window of every layer of `configs` (a draft model reads the target's
    block tables), or None where some layer attends to the whole sequence."""
    windows = [window for config in configs if config for window in config.sliding_windows]
    if not windows or any(window is None for window in windows):
        return None
    return max(window for window in windows if window is not None)


def check_draft_vocabulary(draft_config: ModelConfig, vocab_size: int) -> None:
    """A draft model must cover the target's real vocabulary with its LM head."""
    if draft_config.vocab_size < vocab_size:
        raise ValueError(
            f"the draft model's vocabulary ({draft_config.vocab_size} tokens) is smaller than "
            f"the target's ({vocab_size}); a draft model must share the target's vocabulary"
        )


@dataclass(frozen=True, slots=True)
class ExecutorRecipe:
    """`build_executor`'s arguments as one value, which rank 0 sends to every peer so that all
    ranks build the same executor (the model directory must be at the same path on each)."""

    model_dir: Path
    settings: RunnerSettings
    vocab_size: int
    capability: LogprobCapability = FULL_LOGPROBS
    capacity: int | None = None
    token_capacity: int | None = None
    draft_dir: Path | None = None
    # Whether constrained lanes are served: a peer then builds its own grammar compiler.
    structured_outputs: bool = False
    # Whether loading shows its bars on stderr; only rank 0 shows them.
    progress: bool = False

    def build(
        self,
        collectives: Collectives | None = None,
        local_rank: int = 0,
        grammars: LlguidanceCompiler | None = None,
    ) -> TorchExecutor:
        """This rank's executor; `grammars` is rank 0's compiler (shared with the engine's
        admission check), and other ranks build their own from the model's tokenizer.

        A peer's compiles have no time bound: rank 0 admitted every grammar a plan carries
        within its bound, so a peer that compiles slower only delays that step instead of
        failing it (llguidance's own fuel limits bound the work)."""
        if grammars is None and self.structured_outputs:
            grammars = LlguidanceCompiler(HfTokenizer.from_dir(self.model_dir), timeout_s=None)
        return build_executor(
            self.model_dir,
            self.settings,
            self.vocab_size,
            capability=self.capability,
            capacity=self.capacity,
            token_capacity=self.token_capacity,
            draft_dir=self.draft_dir,
            collectives=collectives,
            local_rank=local_rank,
            grammars=grammars,
            progress=self.progress and (collectives is None or collectives.rank == 0),
        )
