"""Prompt scoring: packed prompt-logprob rows and the scored-prefill frames that hold them.

`prompt_scorer_vp.py` is the vocabulary-parallel twin of `prompt_scorer.py`.
"""
