"""The engine use case and its machinery: admission, steps through the executor port and choice
deltas out (`engine`); continuous batching with chunked prefill and preemption (`scheduler`)
over choices (`sequence`), slots (`slots`) and KV blocks (`blocks`); what one step asks of the
executor (`step`); the commit rule every executor applies (`commit`); which fed tokens a
grammar matcher must still consume (`grammar_catch_up`); the bounded channel to each consumer
(`channel`); and what the steps did, for metrics (`step_stats`, `step_tally`).
"""
