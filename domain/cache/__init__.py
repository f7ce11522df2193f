"""Where choices live on the device, as bookkeeping: the request slots, each admission bumping
its slot's epoch so that stale records are ignored (`slots`); the pool of KV blocks and how many
a length needs (`blocks`); and one choice's placement in them, with how many of its positions
the cache holds (`placement`). The engine's scheduler decides who gets them; prefix caching
will share blocks here.
"""
