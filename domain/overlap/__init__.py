"""The overlapped engine loop as rules: which step may be planned while the one before it still
runs, the placeholder a lane feeds for the token its slot has not yet reported, and how every
executor fills that placeholder in from its own previous submission (`pending`), and which
submissions an executor may commit after it launched the next (`late_commit`). The engine
plans ahead through the scheduler; executors resolve placeholders before they run a plan.
"""
