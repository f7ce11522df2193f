"""Torch model runner, sampler and executor; nothing heavy happens at import."""
