"""Generation logprobs: the completion bundle, its reducers, their sort keys and normalizer."""
