"""Tensor-parallel plumbing: ranks, groups, collectives, launch, rank 0's executor and splits.

The vocabulary-parallel twins of single-rank work live beside their siblings as `*_vp.py`
(`logprobs/`, `scoring/`, `sampling/`); this package only moves ranks and bytes.
"""
