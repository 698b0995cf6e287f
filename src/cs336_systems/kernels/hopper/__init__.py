"""FlashAttention-2 kernels for Hopper GPUs (H100, H200) in Gluon, Triton's lower-level dialect.

Why a second set of kernels: in Triton's own language (`kernels/triton/`) every
matrix product whose result feeds the softmax is followed by a wait for all outstanding tensor-core
work (Triton 3.6's WGMMA pipeliner makes such a dot synchronous), so within a warpgroup the
exponentials and the matrix products never overlap. Gluon exposes the asynchronous ``wgmma``
directly: the forward issues the scores of key tile j+1 and the product P_j V_j back to back,
waits for the scores only (``warpgroup_mma_wait(1)``), and computes the softmax of tile j+1 while
the tensor cores are still busy with P_j V_j: FlashAttention-3's intra-warpgroup overlap. K and V
tiles stream through a ring of shared-memory buffers filled by TMA (bulk tensor copies) ahead of
use.

Scope: compute capability 9.x, fp16/bf16, head dim 16, 32, 64 or 128, tensors whose last dim
is contiguous and whose other strides are 16-byte aligned. `kernels.dispatch.plan` decides, per
call, which passes run here (and says why the others do not); `launch.supported()` checks a
call's tensors.

Conventions are those of the Triton-language kernels: (batch, heads, n, d) tensors, causal
masking top-left aligned (query i sees key j iff i >= j), L the natural-log logsumexp in fp32.

Files:
- `configs`: where each pass runs and with which tiles (plain data, no Gluon);
- `common`: Gluon helpers the kernels share;
- `forward`: both forwards (lockstep and warp-specialized);
- `backward_dkdv`: the one-warpgroup dK/dV pass and the query-tile step it shares with
  `backward_dkdv_ws`, the warp-specialized dK/dV pass (optionally computing dQ);
- `backward_dq`: the warp-specialized dQ pass;
- `launch`: host side (TMA descriptors, compile-time constants, grids, the calls).
PTX/SASS inspection for sm_90 without a GPU: `tests/tools/inspect_sm90.py`.

Keep this file free of imports: planning a call reads `configs` without loading Gluon.
"""
