"""Checks that need a CUDA device: run with `pytest -m gpu tests/gpu` on a machine that has one."""
