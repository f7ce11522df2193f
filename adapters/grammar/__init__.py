"""Grammar engine adapters: llguidance behind ports.grammar, and per-lane token masks."""
