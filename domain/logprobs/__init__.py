"""Logprobs as values and rules, before any wire shape: the normalized value, the natural top-K
order, selected IDs and the packed int32 position layout that device and host share (`values`);
the one rule that gives a logprob request its 400, checked once before admission (`rules`); the
prompt-scoring targets, the packed prompt row and its publication exactly once
(`prompt_scores`); and prompt scoring as a part of the one choice that scores its prompt, which
rows its lanes score and how many are published, kept across a preemption (`scoring`). How
entries are shown on the wire lives in `domain.presentation.logprobs`.
"""
