"""Speculative decoding as rules: the `--speculative-config` value, the history (n-gram) proposer
of draft tokens and how many drafts the next round may offer after what was accepted (`drafts`);
and the verdict every executor gives a round of drafts (`verdict`). The engine's scheduler and
sequences use it and the executors verify the drafts with it.
"""
