"""Vocabulary-parallel logprobs and scoring, parked until tensor parallelism (#13) serves them."""
