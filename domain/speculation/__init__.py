"""Speculative decoding as rules: the `--speculative-config` value, the history (n-gram) proposer
of draft tokens and how many drafts the next round may offer after what was accepted (`drafts`);
speculation as a part of one choice and of its decode lanes, its draft state, the proposals a
step plans and the drafts a lane verifies (`choice`); and the verdict every executor gives a
round of drafts (`verdict`). The engine's scheduler asks the part what a lane adds; the
executors verify the drafts with the verdict.
"""
