"""Fills routed experts and latent attention from Hugging Face mixture-of-experts checkpoints."""

from __future__ import annotations

from collections.abc import Callable

import torch

from adapters.gpu.distributed.split import RankSplit
from adapters.gpu.model.experts import RoutedExperts
from adapters.gpu.model.latent_attention import LatentAttention

Fetch = Callable[[str], torch.Tensor]
Probe = Callable[[str], bool]

# Flavour -> (the sparse block's prefix in a layer, the expert's gate, up and down names).
_EXPERT_NAMES = {
    "qwen2_moe": ("mlp.", ("gate_proj", "up_proj", "down_proj")),
    "qwen3_moe": ("mlp.", ("gate_proj", "up_proj", "down_proj")),
    "deepseek_v3": ("mlp.", ("gate_proj", "up_proj", "down_proj")),
    "mixtral": ("block_sparse_moe.", ("w1", "w3", "w2")),
}


def _checked(target: torch.Tensor, tensor: torch.Tensor, what: str) -> None:
    if tuple(tensor.shape) != tuple(target.shape):
        raise ValueError(
            f"tensor {what} has shape {tuple(tensor.shape)}, expected {tuple(target.shape)}"
        )
    target.copy_(tensor)


def fill_experts(
    experts: RoutedExperts, fetch: Fetch, has: Probe, layer_prefix: str, flavour: str
) -> None:
    """Copies one sparse layer's router, experts (this rank's columns) and shared expert.

    Experts come one tensor per expert (`experts.{e}.gate_proj.weight`, as checkpoints on the
    Hub hold them) or stacked [experts, rows, columns]: `experts.gate_up_proj` and
    `experts.down_proj` as transformers 5 keeps them in memory, or `experts.gate_proj`,
    `experts.up_proj` and `experts.down_proj` as a GGUF export writes them."""
    block, (gate_name, up_name, down_name) = _EXPERT_NAMES[flavour]
    prefix = layer_prefix + block
    start, stop = experts.columns
    width = stop - start
    _checked(experts.router_weight, fetch(prefix + "gate.weight").float(), prefix + "gate.weight")
    if experts.correction_bias is not None:
        name = prefix + "gate.e_score_correction_bias"
        _checked(experts.correction_bias, fetch(name).float(), name)
    if has(prefix + f"experts.0.{gate_name}.weight"):
        for index in range(experts.settings.num_experts):
            names = [prefix + f"experts.{index}.{part}.weight" for part in (gate_name, up_name)]
            gate_up = torch.cat([fetch(name).narrow(0, start, width) for name in names])
            _checked(experts.gate_up_weight[index], gate_up, " + ".join(names))
            down = prefix + f"experts.{index}.{down_name}.weight"
            _checked(experts.down_weight[index], fetch(down).narrow(1, start, width), down)
    else:
        fused = prefix + "experts.gate_up_proj"
        if has(fused):
            inner = experts.settings.inner
            both = fetch(fused)
            gate, up = both[:, start:stop], both[:, inner + start : inner + stop]
            names = [fused]
        else:
            names = [prefix + "experts.gate_proj", prefix + "experts.up_proj"]
            gate, up = (fetch(name)[:, start:stop] for name in names)
        _checked(experts.gate_up_weight, torch.cat((gate, up), dim=1), " + ".join(names))
        down = prefix + "experts.down_proj"
        _checked(experts.down_weight, fetch(down)[:, :, start:stop], down)
    if experts.shared_gate_up_weight is not None and experts.shared_down_weight is not None:
        first, last = experts.shared_columns
        # Qwen2-MoE's one gated shared expert, DeepSeek's (fused) shared experts.
        shared = prefix + ("shared_expert." if flavour == "qwen2_moe" else "shared_experts.")
        names = [shared + f"{part}.weight" for part in ("gate_proj", "up_proj")]
        gate_up = torch.cat([fetch(name)[first:last] for name in names])
        _checked(experts.shared_gate_up_weight, gate_up, " + ".join(names))
        down = shared + "down_proj.weight"
        _checked(experts.shared_down_weight, fetch(down)[:, first:last], down)
        if experts.shared_gate_weight is not None:
            gate_key = prefix + "shared_expert_gate.weight"
            _checked(experts.shared_gate_weight, fetch(gate_key), gate_key)


def fill_latent_attention(
    latent: LatentAttention, fetch: Fetch, attention_prefix: str, split: RankSplit | None
) -> None:
    """Copies one layer's latent attention, keeping this rank's heads of the per-head
    projections; interleaved rotary dimensions are permuted to the rotate-half layout."""
    settings = latent.settings
    first, last = (0, latent.num_heads) if split is None or split.whole else split.query_heads
    query_head = settings.nope_dim + settings.rope_dim
    value_head = settings.nope_dim + settings.value_dim
    order = _rotate_half_order(settings.rope_dim, settings.interleaved_rope)

    def take(target: torch.Tensor | None, name: str, rows: tuple[int, int] | None = None) -> None:
        if target is None:
            return
        tensor = fetch(attention_prefix + name)
        if rows is not None:
            tensor = tensor[rows[0] : rows[1]]
        _checked(target, tensor, attention_prefix + name)

    query_name = "q_proj.weight" if settings.q_lora_rank is None else "q_b_proj.weight"
    queries = fetch(attention_prefix + query_name)[first * query_head : last * query_head]
    heads = queries.reshape(last - first, query_head, -1)
    rope = heads[:, settings.nope_dim :].index_select(1, order)
    heads = torch.cat((heads[:, : settings.nope_dim], rope), dim=1)
    _checked(latent.q_weight, heads.reshape(queries.shape), attention_prefix + query_name)
    take(latent.q_a_weight, "q_a_proj.weight")
    take(latent.q_a_bias, "q_a_proj.bias")
    take(latent.q_a_norm, "q_a_layernorm.weight")
    rank = settings.kv_lora_rank
    shared_order = torch.cat((torch.arange(rank), rank + order))
    name = attention_prefix + "kv_a_proj_with_mqa.weight"
    _checked(latent.kv_a_weight, fetch(name).index_select(0, shared_order), name)
    if latent.kv_a_bias is not None:
        name = attention_prefix + "kv_a_proj_with_mqa.bias"
        _checked(latent.kv_a_bias, fetch(name).index_select(0, shared_order), name)
    take(latent.kv_a_norm, "kv_a_layernorm.weight")
    take(latent.kv_b_weight, "kv_b_proj.weight", (first * value_head, last * value_head))
    name = attention_prefix + "o_proj.weight"
    columns = fetch(name)[:, first * settings.value_dim : last * settings.value_dim]
    _checked(latent.output_weight, columns, name)
    take(latent.output_bias, "o_proj.bias")


def _rotate_half_order(rope_dim: int, interleaved: bool) -> torch.Tensor:
    """Source index of each rotary dimension: pairs (0, 1), (2, 3), ... become (0, d/2),
    (1, d/2 + 1), ... so that rotate-half rotates the pairs the checkpoint meant."""
    if not interleaved:
        return torch.arange(rope_dim)
    return torch.cat((torch.arange(0, rope_dim, 2), torch.arange(1, rope_dim, 2)))
