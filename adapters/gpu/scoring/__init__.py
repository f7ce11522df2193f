"""Prompt scoring: packed prompt-logprob rows and the scored-prefill frames that hold them."""
