"""Speculative decoding on the device: the draft model that proposes."""
