"""FlashAttention-2 kernels: in PyTorch, in Triton's language, and for Hopper GPUs in Gluon.

- `flash_pytorch`: FA2 in PyTorch (its autograd Function, tiles as arguments).
- `flash_triton`: the Triton-side autograd Function `FlashAttentionTriton`, the model's entry
  point `flash_attention`, the launchers of the forward and the backward, their custom ops for
  torch.compile, and `chosen_configs()` / `last_plans()`: what the last calls ran.
- `dispatch`: which kernel runs each pass, with which tiles, and why (`plan`): the one place
  that decides between the Gluon and the Triton-language kernels.
- `flash_triton_forward`, `flash_triton_backward`: the Triton-language kernels;
  `flash_triton_common`: their shared helpers and the interpreter switch;
  `flash_triton_configs`: their tiles (autotuner candidates, the interpreter's);
  `flash_triton_launch`: launching, autotuning, tensor descriptors, `precompile`.
- `hopper/`: the Gluon kernels for sm_90 (see its `__init__`); `inspect_sm90`: what they
  compile to (PTX, SASS, registers), without a GPU.
- `attention`: the registry of attention functions by name.

Imports only `model` and `core` from the package. Keep this file free of imports: importing
one kernel must not import the others.
"""
