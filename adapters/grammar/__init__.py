"""Grammar engine adapters: llguidance behind ports.grammar (lane masks live in gpu/grammar)."""
