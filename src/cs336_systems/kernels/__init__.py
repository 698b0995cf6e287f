"""FlashAttention-2 kernels: in PyTorch, in Triton's language, and for Hopper GPUs in Gluon.

- `flash_pytorch`: FA2 in PyTorch (its autograd Function, tiles as arguments).
- `flash_triton`: the Triton-side autograd Function `FlashAttentionTriton`, the model's entry
  point `flash_attention`, the launchers of the forward and the backward, their custom ops for
  torch.compile, and `chosen_configs()` / `last_plans()`: what the last calls ran.
- `dispatch`: which kernel runs each pass, with which tiles, and why (`plan`): the one place
  that decides between the Gluon and the Triton-language kernels.
- `triton/`: the Triton-language kernels (forward, backward, their helpers, tiles and launch);
- `hopper/`: the Gluon kernels for sm_90 (see its `__init__`); what they compile to (PTX, SASS,
  registers) without a GPU: `tests/tools/inspect_sm90.py`.
- `attention`: the registry of attention functions by name.

Imports only `planning`, `model` and `core` from the package. Keep this file free of imports: importing
one kernel must not import the others.
"""
