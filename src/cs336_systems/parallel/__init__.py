"""Distributed training: the torchrun launcher, the collectives (one wrappable indirection),
DDP variants, the sharded optimizer, FSDP.

Imports `core` and `model`, never `stages`.
"""
