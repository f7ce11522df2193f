"""Checks that need a CUDA device, marked `gpu`: run `pytest -m gpu tests/cuda` where one is."""
