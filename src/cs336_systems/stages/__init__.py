"""The pipeline's stages, one folder each, named as in the config and the rules files.

A stage imports from `core`, `model`, `kernels`, `parallel` and `profiling`, never from another
stage (tests/test_layout.py enforces it); stages meet only through their CSVs.
"""
