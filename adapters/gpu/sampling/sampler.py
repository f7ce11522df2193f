"""Batched token sampling: logit edits, penalties, temperature, filtering and seeded draws."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from adapters.gpu.sampling.philox import philox_uniform

# Temperatures this small would overflow float32 logits; such rows are sampled greedily (as vLLM).
GREEDY_TEMPERATURE_BELOW = 1e-5
# Philox streams: the last counter word names what a draw is for, so the draws made at one
# position (the plain draw, a draft's acceptance test, the draw after a rejection) never share
# noise, and a round without drafts draws exactly what plain decoding draws.
SAMPLE_STREAM = 0
ACCEPT_STREAM = 1
RESIDUAL_STREAM = 2
DRAFT_STREAM = 3

_ROW_FIELDS = (
    ("temperature", torch.float32),
    ("top_k", torch.int32),
    ("top_p", torch.float32),
    ("min_p", torch.float32),
    ("presence_penalty", torch.float32),
    ("frequency_penalty", torch.float32),
    ("repetition_penalty", torch.float32),
    ("seeds", torch.int64),
    ("counters", torch.int64),
)
_PAIR_FIELDS = (
    (("bias_rows", torch.int64), ("bias_token_ids", torch.int64), ("bias_values", torch.float32)),
    (("banned_rows", torch.int64), ("banned_token_ids", torch.int64)),
)
_FLAG_FIELDS = ("all_greedy", "any_penalties", "any_top_k_top_p", "any_min_p")


@dataclass(frozen=True)
class SamplingTensors:
    """Per-row sampling parameters of one batch of R rows, all on the logits' device.

    Disabled values: top_k 0 (or >= vocab), top_p 1.0, min_p 0.0, presence and frequency
    penalties 0.0, repetition_penalty 1.0; temperature 0 means greedy. Presence and frequency
    penalties count generated tokens only (`output_counts`); the repetition penalty covers
    prompt and generated tokens and is applied only when `prompt_mask` is given. The flags are
    computed by the caller so that the sampler never reads tensor values back to the host:
    `all_greedy` (every temperature is 0), `any_penalties` (some row uses a penalty; then
    `output_counts` is required), `any_top_k_top_p`, `any_min_p` (some row may use that filter).
    `seeds` and `counters` (the position of the token being sampled) key each row's noise.
    A grammar constrains rows `mask_rows` (int64 [M]): `token_bitmask` (int32 [M, W], bit
    t % 32 of word t // 32) holds the tokens each may sample; the others cost nothing.
    """

    temperature: Tensor
    top_k: Tensor
    top_p: Tensor
    min_p: Tensor
    presence_penalty: Tensor
    frequency_penalty: Tensor
    repetition_penalty: Tensor
    output_counts: Tensor | None
    prompt_mask: Tensor | None
    bias_rows: Tensor
    bias_token_ids: Tensor
    bias_values: Tensor
    banned_rows: Tensor
    banned_token_ids: Tensor
    seeds: Tensor
    counters: Tensor
    all_greedy: bool
    any_penalties: bool
    # Leaving these True is always correct; False skips the sort or the max that the filter costs.
    any_top_k_top_p: bool = True
    any_min_p: bool = True
    mask_rows: Tensor | None = None
    token_bitmask: Tensor | None = None

    def __post_init__(self) -> None:
        for name in _FLAG_FIELDS:
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool")
        if not isinstance(self.temperature, Tensor):
            raise TypeError("temperature must be a tensor")
        device = self.temperature.device
        rows = _length(self.temperature)
        for name, dtype in _ROW_FIELDS:
            _check_tensor(name, getattr(self, name), dtype, device, (rows,))
        for group in _PAIR_FIELDS:
            length = _length(getattr(self, group[0][0]))
            for name, dtype in group:
                _check_tensor(name, getattr(self, name), dtype, device, (length,))
        for name, dtype in (("output_counts", torch.int32), ("prompt_mask", torch.bool)):
            value = getattr(self, name)
            if value is not None:
                vocab = value.shape[-1] if isinstance(value, Tensor) and value.dim() else -1
                _check_tensor(name, value, dtype, device, (rows, vocab))
        if self.prompt_mask is not None and (
            self.output_counts is None or self.output_counts.shape != self.prompt_mask.shape
        ):
            raise ValueError("prompt_mask needs output_counts of the same shape")
        if self.any_penalties and self.output_counts is None:
            raise ValueError("any_penalties needs output_counts")
        if not self.any_penalties and self.prompt_mask is not None:
            raise ValueError("prompt_mask is given but any_penalties is False")
        if (self.mask_rows is None) != (self.token_bitmask is None):
            raise ValueError("mask_rows and token_bitmask come together")
        if self.mask_rows is not None and self.token_bitmask is not None:
            masks = _length(self.mask_rows)
            _check_tensor("mask_rows", self.mask_rows, torch.int64, device, (masks,))
            words = self.token_bitmask.shape[-1] if self.token_bitmask.dim() == 2 else -1
            _check_tensor("token_bitmask", self.token_bitmask, torch.int32, device, (masks, words))

    @property
    def rows(self) -> int:
        return self.temperature.shape[0]


def _length(value: object) -> int:
    """Length of a 1-D tensor, or -1 so that the shape check reports it."""
    return value.shape[0] if isinstance(value, Tensor) and value.dim() == 1 else -1


def _check_tensor(
    name: str, value: object, dtype: torch.dtype, device: torch.device, shape: tuple[int, ...]
) -> None:
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a tensor")
    if value.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, got {value.dtype}")
    if value.device != device:
        raise ValueError(f"{name} is on {value.device}, expected {device}")
    if tuple(value.shape) != shape or -1 in shape:
        raise ValueError(f"{name} has shape {tuple(value.shape)}, expected {shape}")


def edited_logits(logits: Tensor, tensors: SamplingTensors) -> Tensor:
    """A float32 copy of `logits` with logit_bias, bans and penalties applied, in vLLM order."""
    scratch = logits.to(dtype=torch.float32, copy=True)
    if tensors.bias_rows.numel():
        scratch.index_put_(
            (tensors.bias_rows, tensors.bias_token_ids), tensors.bias_values, accumulate=True
        )
    if tensors.banned_rows.numel():
        banned = torch.full_like(tensors.banned_rows, -math.inf, dtype=torch.float32)
        scratch.index_put_((tensors.banned_rows, tensors.banned_token_ids), banned)
    if tensors.any_penalties:
        _apply_penalties(scratch, tensors)
    if tensors.mask_rows is not None and tensors.token_bitmask is not None:
        # Scratch only: the logprob reduction reads the raw logits, never this copy.
        allowed = allowed_columns(tensors.token_bitmask, scratch.shape[1])
        rows = scratch.index_select(0, tensors.mask_rows).masked_fill_(~allowed, -math.inf)
        scratch.index_copy_(0, tensors.mask_rows, rows)
    return scratch


def allowed_columns(bitmask: Tensor, vocab_size: int) -> Tensor:
    """bool [M, vocab_size]: the bits of `bitmask` int32 [M, W] unpacked per token."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    return ((bitmask.unsqueeze(2) >> shifts) & 1).flatten(1)[:, :vocab_size].bool()


def _apply_penalties(scratch: Tensor, tensors: SamplingTensors) -> None:
    counts = tensors.output_counts
    if counts is None:
        return
    generated = counts > 0
    if tensors.prompt_mask is not None:
        seen = generated | tensors.prompt_mask
        penalty = tensors.repetition_penalty.unsqueeze(1)
        penalised = torch.where(scratch > 0, scratch / penalty, scratch * penalty)
        torch.where(seen, penalised, scratch, out=scratch)
    scratch.sub_(tensors.frequency_penalty.unsqueeze(1) * counts)
    scratch.sub_(tensors.presence_penalty.unsqueeze(1) * generated)


class RowLanes(Protocol):
    """Where a sampler's logits columns lie in the vocabulary, and how a row's whole-vocabulary
    quantities are formed: from the columns alone on one rank, by exchanges when each rank holds
    a vocabulary shard. IDs in and out are global token IDs."""

    first: int  # the global token ID of column 0

    def argmax(self, *scores: Tensor) -> tuple[Tensor, ...]:
        """Per score matrix, the ID of each row's maximum (the lowest ID among equals)."""
        ...

    def row_max(self, scores: Tensor) -> Tensor:
        """[R, 1]: each row's largest value."""
        ...

    def cutoff(self, scaled: Tensor, tensors: SamplingTensors) -> Tensor:
        """[R, 1]: the smallest value that top_k and then top_p keep."""
        ...

    def softmax(self, scores: Tensor) -> Tensor:
        """The row's probabilities over the whole vocabulary, at these columns."""
        ...

    def pick(self, values: Tensor, token_ids: Tensor) -> Tensor:
        """[R]: each row's value at its token ID (a valid ID of the vocabulary)."""
        ...

    def exclude(self, scores: Tensor, token_ids: Tensor) -> Tensor:
        """A copy of `scores` with each row's token ID at -inf."""
        ...


class WholeRows:
    """`RowLanes` of a rank holding every column: plain row operations, no exchange."""

    first = 0

    def argmax(self, *scores: Tensor) -> tuple[Tensor, ...]:
        return tuple(score.argmax(dim=1) for score in scores)

    def row_max(self, scores: Tensor) -> Tensor:
        return scores.amax(dim=1, keepdim=True)

    def cutoff(self, scaled: Tensor, tensors: SamplingTensors) -> Tensor:
        return top_k_top_p_cutoff(scaled, tensors.top_k, tensors.top_p)

    def softmax(self, scores: Tensor) -> Tensor:
        return scores.softmax(dim=1)

    def pick(self, values: Tensor, token_ids: Tensor) -> Tensor:
        return values.gather(1, token_ids.unsqueeze(1)).squeeze(1)

    def exclude(self, scores: Tensor, token_ids: Tensor) -> Tensor:
        return scores.scatter(1, token_ids.unsqueeze(1), -math.inf)


WHOLE_ROWS = WholeRows()


def filtered_logits(
    logits: Tensor, tensors: SamplingTensors, lanes: RowLanes = WHOLE_ROWS
) -> Tensor:
    """New tensor: `logits` divided by temperature, then min_p, top_k and top_p set to -inf.

    Greedy rows are divided by 1. Tokens tied with the last kept one are kept too.
    """
    greedy = tensors.temperature < GREEDY_TEMPERATURE_BELOW
    divisor = torch.where(greedy, torch.ones_like(tensors.temperature), tensors.temperature)
    scaled = logits.to(torch.float32) / divisor.unsqueeze(1)
    if tensors.any_min_p:
        # prob < min_p * max_prob, compared in log space to skip a softmax.
        floor = torch.log(tensors.min_p).unsqueeze(1)
        scaled.masked_fill_(scaled - lanes.row_max(scaled) < floor, -math.inf)
    if tensors.any_top_k_top_p:
        scaled.masked_fill_(scaled < lanes.cutoff(scaled, tensors), -math.inf)
    return scaled


def top_k_top_p_cutoff(scaled: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """Per row [R, 1], the smallest logit of whole rows that both top_k and then top_p keep."""
    vocab = scaled.shape[1]
    ranked = scaled.sort(dim=1, descending=True).values
    top_k = top_k.to(torch.int64)
    top_k = torch.where((top_k <= 0) | (top_k > vocab), vocab, top_k)
    k_cutoff = ranked.gather(1, (top_k - 1).unsqueeze(1))
    ranked.masked_fill_(ranked < k_cutoff, -math.inf)
    probs = ranked.softmax(dim=1)
    mass_before = torch.nn.functional.pad(probs.cumsum(dim=1)[:, :-1], (1, 0))
    # Rounding can leave the total mass just under 1.0, so a disabled top_p must not compare.
    top_p = torch.where(top_p < 1.0, top_p, math.inf).unsqueeze(1)
    kept = (mass_before < top_p).sum(dim=1, keepdim=True).clamp_(min=1)
    p_cutoff = ranked.gather(1, kept - 1)
    return torch.maximum(k_cutoff, p_cutoff)


class Sampler:
    """Turns a batch of raw logits rows into sampled token IDs, never writing to the logits.

    The logits hold the columns `lanes` describes: the whole vocabulary, or one rank's shard,
    whose whole-row quantities (maxima, cutoffs, normalizers, the winning ID) `lanes` forms by
    exchanges. Noise is keyed by global token ID, so a draw does not depend on the sharding.
    """

    def __init__(self, lanes: RowLanes = WHOLE_ROWS) -> None:
        self._lanes = lanes

    def sample(self, logits: Tensor, tensors: SamplingTensors) -> Tensor:
        """Chosen token ID per row, int64 [R]; greedy ties go to the lowest token ID."""
        self._check(logits, tensors)
        lanes = self._lanes
        processed = edited_logits(logits, tensors) if _needs_edit(tensors) else logits
        if tensors.all_greedy:
            return lanes.argmax(processed)[0]
        scores = filtered_logits(processed, tensors, lanes)
        noisy = _gumbel_scores(scores, tensors, SAMPLE_STREAM, lanes.first)
        greedy_chosen, random_chosen = lanes.argmax(processed, noisy)
        greedy = tensors.temperature < GREEDY_TEMPERATURE_BELOW
        return torch.where(greedy, greedy_chosen, random_chosen)

    @staticmethod
    def _check(logits: Tensor, tensors: SamplingTensors) -> None:
        if logits.dim() != 2 or logits.shape[0] != tensors.rows:
            shape = tuple(logits.shape)
            raise ValueError(f"logits shape {shape} does not match {tensors.rows} rows")
        if not logits.dtype.is_floating_point:
            raise TypeError(f"logits must be floating point, got {logits.dtype}")
        counts = tensors.output_counts
        if counts is not None and counts.shape[1] != logits.shape[1]:
            raise ValueError(f"output_counts vocab {counts.shape[1]} != logits {logits.shape[1]}")

    def verify(
        self,
        logits: Tensor,
        tensors: SamplingTensors,
        drafts: Tensor,
        draft_probs: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Per target row: whether its draft stands (bool [R]) and the token the row emits when
        it does not (int64 [R]).

        `drafts` int64 [R] holds the draft proposed at each row's position, -1 for a row
        without one (a bonus row, or a width-one round). Every transform applies as in
        `sample`, on scratch. Greedy rows keep a draft equal to their argmax and emit the
        argmax. Random rows keep draft d with probability min(1, p(d) / q(d)), p being the
        row's filtered distribution and q the draft's (`draft_probs` [R, V]; without it q is
        one-hot at d, a history proposal), and otherwise emit a draw from the leftover
        (p - q)+, renormalized; a row without a draft draws from p with plain sampling's noise,
        so `verify` and `sample` agree on it.
        """
        self._check(logits, tensors)
        lanes = self._lanes
        processed = edited_logits(logits, tensors) if _needs_edit(tensors) else logits
        has_draft = drafts >= 0
        if tensors.all_greedy:
            (greedy_chosen,) = lanes.argmax(processed)
            return has_draft & (greedy_chosen == drafts), greedy_chosen
        safe = drafts.clamp(min=0)
        scores = filtered_logits(processed, tensors, lanes)
        probs = lanes.softmax(scores)
        p_draft = lanes.pick(probs, safe)
        uniform = philox_uniform(tensors.seeds, tensors.counters, 1, ACCEPT_STREAM).squeeze(1)
        if draft_probs is None:
            random_keeps = has_draft & (uniform < p_draft)
            leftover = lanes.exclude(scores, safe)
        else:
            q_draft = lanes.pick(draft_probs, safe)
            # u < p / q, multiplied out: q(d) > 0 for a drawn draft, and p / q >= 1 keeps it.
            random_keeps = has_draft & (uniform * q_draft < p_draft)
            leftover = (probs - draft_probs).clamp_(min=0.0).log_()
        residual = torch.where(has_draft.unsqueeze(1), leftover, scores)
        streams = torch.where(has_draft, RESIDUAL_STREAM, SAMPLE_STREAM)
        noisy = _gumbel_scores(residual, tensors, streams, lanes.first)
        greedy_chosen, random_chosen = lanes.argmax(processed, noisy)
        greedy_keeps = has_draft & (greedy_chosen == drafts)
        greedy = tensors.temperature < GREEDY_TEMPERATURE_BELOW
        return (
            torch.where(greedy, greedy_keeps, random_keeps),
            torch.where(greedy, greedy_chosen, random_chosen),
        )

    def draw(self, logits: Tensor, tensors: SamplingTensors) -> tuple[Tensor, Tensor]:
        """A draft model's proposals: one token per row (int64 [R]) and the distribution q it
        was drawn from (float32 [R, V]; one-hot at the argmax for greedy rows), drawn from the
        DRAFT stream so it never shares noise with the target's draws. A draft model holds the
        whole vocabulary, so this never exchanges."""
        self._check(logits, tensors)
        processed = edited_logits(logits, tensors) if _needs_edit(tensors) else logits
        greedy_chosen = processed.argmax(dim=1)
        one_hot = torch.zeros_like(processed, dtype=torch.float32).scatter_(
            1, greedy_chosen.unsqueeze(1), 1.0
        )
        if tensors.all_greedy:
            return greedy_chosen, one_hot
        scores = filtered_logits(processed, tensors)
        q = scores.softmax(dim=1)
        random_chosen = _gumbel_scores(scores, tensors, DRAFT_STREAM, 0).argmax(dim=1)
        greedy = tensors.temperature < GREEDY_TEMPERATURE_BELOW
        return (
            torch.where(greedy, greedy_chosen, random_chosen),
            torch.where(greedy.unsqueeze(1), one_hot, q),
        )


def _needs_edit(tensors: SamplingTensors) -> bool:
    return (
        tensors.any_penalties
        or tensors.bias_rows.numel() > 0
        or tensors.banned_rows.numel() > 0
        or tensors.mask_rows is not None
    )


def _gumbel_scores(
    scores: Tensor, tensors: SamplingTensors, streams: Tensor | int, first: int
) -> Tensor:
    """score + Gumbel noise, whose argmax is a draw from softmax(score); `scores` is overwritten.
    Column c carries token `first + c`'s noise."""
    noise = philox_uniform(tensors.seeds, tensors.counters, scores.shape[1], streams, first)
    noise.log_().neg_().clamp_(min=torch.finfo(torch.float32).tiny).log_().neg_()
    return scores.add_(noise)
