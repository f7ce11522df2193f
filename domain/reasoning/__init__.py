"""The thinking budget: vLLM's `thinking_token_budget` as a request value, and the tracker that
forces a reasoning block's end once it has used its tokens (`thinking`). Parsing reasoning out
of the generated text is the output parsers' work (`domain.parsers`): they read the emitted
deltas, which sit above the requests that carry this budget, so the two cannot share a package
without a circle.
"""
