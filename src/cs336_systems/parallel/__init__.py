"""Distributed training: the launcher, the collectives (one wrappable indirection),
DDP variants, the sharded optimizer, FSDP.

Imports `planning`, `core`, `model` and `kernels`, never `profiling`, `engine` or a stage.
"""
