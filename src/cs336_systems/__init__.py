"""Benchmark, profile and explain transformer language-model training on a GPU (or a CPU)."""
