"""Output constraints that pass admission and break mid-output under llguidance's own limits."""

from __future__ import annotations

# Rules of 60 alternatives each, so no rule is large, yet the Earley row that predicts all of
# them holds about 3,660 items, over llguidance's default limit of 2,000 per row.
_GROUPS = 60


def row_explosion_grammar(words: int = 4) -> str:
    """A Lark grammar of `words` free words ("yes " or "no ", so 2 to 4 tokens each on a
    byte-level BPE), then one of 3,600 literals reached through 60 rules of 60.

    It compiles, and its first masks are fine; the row that predicts the literals is built when
    the last word completes, and llguidance then refuses the token ("Current row has 3662
    items; max is 2000"): the grammar breaks after several generated tokens, whatever the
    model picks.
    """
    rules = [
        "start: " + " ".join(["word"] * words) + " tail",
        'word: "yes " | "no "',
        "tail: " + " | ".join(f"group{g}" for g in range(_GROUPS)),
    ]
    for group in range(_GROUPS):
        literals = " | ".join(f'"{group}x{item}"' for item in range(_GROUPS))
        rules.append(f"group{group}: {literals}")
    return "\n".join(rules)
