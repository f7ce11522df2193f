"""Generation logprobs: the completion bundle, its reducers, their sort keys and normalizer.

A `*_vp.py` module is the vocabulary-parallel twin of the module with the same stem.
"""
