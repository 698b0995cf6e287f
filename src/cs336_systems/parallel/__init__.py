"""Distributed training: the torchrun launcher, DDP variants, the sharded optimizer.

Imports `core` and `model`, never `stages`.
"""
