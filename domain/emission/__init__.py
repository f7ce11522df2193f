"""What a choice emits, turned from completion records into consumer-facing values: the one rule
for which emitted tokens get logprob entries and in which part of the output (`entries`: forced
tokens, stop tokens, stop strings, echo, and the part a parser finds a token in); the per-choice
emission state machine that applies it (`choice`); stop-string matching with hold-back
(`stops`); incremental detokenization into whole UTF-8 characters and their offsets
(`detokenizer`); the deltas and end a request's consumer receives (`outputs`), the bounded
channel they travel in from the engine thread (`channel`), and one request's consumer side, its
choices' machines feeding its channel (`request_output`).
"""
