"""FlashAttention-2 kernels: in PyTorch (flash_pytorch), in Triton (flash_triton) and for Hopper
GPUs in Gluon (hopper), and the registry of attention functions by name (attention).

Imports only `model` from the package. Keep this file free of imports: importing one kernel must
not import the others.
"""
