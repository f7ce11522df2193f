"""The grammar port: compiles output constraints and walks them token by token."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from domain.structured.grammar import GrammarSpec


class GrammarMatcher(Protocol):
    """Where one constrained output stands in its grammar.

    Invariants an implementation keeps:
    - `allowed_token_ids()` is the set of tokens the grammar accepts next; an EOS token is in
      it exactly when the output so far is complete (`is_finished`).
    - `accept(ids)` advances by the tokens and returns True only when all were allowed; on
      False the matcher is unusable (a caller never feeds a token the mask forbade).
    - `rollback(n)` undoes the last `n` accepted tokens (rejected speculative drafts).
    """

    @property
    def is_finished(self) -> bool: ...

    def allowed_token_ids(self) -> frozenset[int]: ...

    def accept(self, token_ids: Sequence[int]) -> bool: ...

    def rollback(self, count: int) -> None: ...


class MaskingMatcher(GrammarMatcher, Protocol):
    """A matcher that writes its next mask into a caller's buffer, for executors that mask
    logits in place.

    Invariants an implementation keeps, beyond GrammarMatcher's:
    - `fill_bitmask(address)` writes the allowed-token bits (bit t % 32 of int32 word t // 32)
      at `address`, which holds `mask_bytes`; it may release the GIL while it computes.
    - `error` is empty while the matcher is usable and names what broke once it is not (a
      failed `fill_bitmask` is reported only there).
    """

    @property
    def mask_bytes(self) -> int: ...

    @property
    def error(self) -> str: ...

    def fill_bitmask(self, address: int) -> None: ...


class CompiledGrammar(Protocol):
    """A compiled constraint; every `matcher()` starts at the beginning of the output."""

    def matcher(self) -> GrammarMatcher: ...


class MaskingGrammar(Protocol):
    """A compiled constraint whose matchers fill masks in place."""

    def matcher(self) -> MaskingMatcher: ...


class GrammarCompiler(Protocol):
    """Compiles specs for one tokenizer's vocabulary.

    Invariants an implementation keeps:
    - `compile` raises `InvalidRequestError` with `param = spec.param` for a spec it cannot
      take (invalid or unsupported schema, regex or grammar, a limit broken at the first
      token, or a compile that overran its time bound), naming the problem; it admits nothing,
      so the engine calls it before admission.
    - `compile` blocks its caller for at most its time bound, counted from the call (a wait
      for a free compile slot included), so event-loop callers run it on a thread.
    - Equal specs (`GrammarSpec.key`) may return the same cached grammar; the cache is bounded.
      A spec refused for what it is may be remembered (bounded) and refused again at once.
    """

    def compile(self, spec: GrammarSpec) -> CompiledGrammar: ...


class MaskingCompiler(Protocol):
    """A GrammarCompiler for an executor that masks in place: its grammars' matchers fill
    masks, and it names the vocabulary width and the EOS tokens the masks cover."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_token_ids(self) -> frozenset[int]: ...

    def compile(self, spec: GrammarSpec) -> MaskingGrammar: ...
