"""Turning checkpoints into a decoder: safetensors loading, GGUF export, the embedded model."""
