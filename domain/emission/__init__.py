"""What a choice emits, turned from completion records into consumer-facing values: which emitted
tokens get logprob entries, and the per-choice emission state machine (`choice`); stop-string
matching with hold-back (`stops`); incremental detokenization into whole UTF-8 characters and
their offsets (`detokenizer`); and the deltas and end a request's consumer receives (`outputs`).
"""
