"""The overlapped engine loop as rules: which step may be planned while the one before it still
runs, the placeholder a lane feeds for the token its slot has not yet reported, and how every
executor fills that placeholder in from its own previous submission (`pending`). The engine
plans ahead through the scheduler; executors resolve placeholders before they run a plan.
"""
