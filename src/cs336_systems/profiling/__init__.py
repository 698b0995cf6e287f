"""Profiling: Nsight Systems capture and parsing, kernel-name classification, attribution of
kernels to phases and attention's parts, the annotated attention.

Imports `planning`, `core`, `model` and `kernels`, never `parallel`, `engine` or a stage.
"""
