"""Tensor parallelism: the model split, sharded sampling, vocabulary-parallel logprobs and ranks."""
