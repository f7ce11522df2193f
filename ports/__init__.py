"""Protocols the domain drives; they speak domain values only."""
