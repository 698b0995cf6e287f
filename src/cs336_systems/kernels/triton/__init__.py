"""FlashAttention-2 kernels in Triton's language (any GPU, and Triton's interpreter on a CPU).

Files:
- `forward`, `backward`: the kernels;
- `common`: their shared helpers and the interpreter switch;
- `configs`: their tiles (autotuner candidates, the interpreter's);
- `launch`: launching, autotuning, tensor descriptors, `precompile`.

The autograd Function that runs them (or the Gluon kernels of `hopper/`) is
`kernels/flash_triton.py`. Keep this file free of imports.
"""
