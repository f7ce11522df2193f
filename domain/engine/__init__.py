"""The engine core: admission, steps through the executor port and choice deltas out (`engine`);
the admitted requests, each choice a sequence with one part per feature it uses, their commits
and ends (`admitted`); continuous batching with chunked prefill and preemption (`scheduler`)
over sequences, each keeping a choice's identity and progress (`sequence`); what one step asks
of the executor, each lane carrying its features' parts (`step`); and the commit rule every
executor applies (`commit`). Features keep their state and rules in their own packages."""
