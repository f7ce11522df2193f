"""Logprobs as values and rules, before any wire shape: the normalized value, the natural top-K
order, selected IDs and the packed int32 position layout that device and host share (`values`);
the one rule that gives a logprob request its 400, checked once before admission (`rules`); and
the prompt-scoring targets, the packed prompt row and its publication exactly once
(`prompt_scores`). How entries are shown on the wire lives in `domain.presentation.logprobs`.
"""
