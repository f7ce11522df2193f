"""Where choices live on the device, as bookkeeping: the request slots, each admission bumping
its slot's epoch so that stale records are ignored (`slots`); how many KV blocks a length needs
(`blocks`); the pool of KV blocks, which counts each block's readers and publishes full blocks
under chained digests so that a repeated prefix is read, not recomputed (`pool`); and one
choice's placement in them, with how many of its positions the cache holds (`placement`); and
what a request's `cache_salt`, which scopes the blocks it may read, may be (`salt`). The
engine's scheduler decides who gets them.
"""
