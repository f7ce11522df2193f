"""Pure rules of Helios: requests, records, scheduling, emission and text (stdlib only)."""
