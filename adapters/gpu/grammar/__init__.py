"""Constrained lanes on the device: one matcher per slot, token masks per target row."""
