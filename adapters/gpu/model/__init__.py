"""The Llama-family decoder: configuration, weights layout, attention, RoPE and the KV cache."""
