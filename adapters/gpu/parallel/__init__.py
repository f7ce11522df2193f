"""Vocabulary-parallel logprobs and prompt scoring: shard work joined by compact exchanges."""
