"""Token sampling: logit edits, penalties, filtering and seeded Philox draws.

`sampler_vp.py` samples rows whose vocabulary is split across ranks (twin of `sampler.py`).
"""
