"""FlashAttention-2 (PyTorch and Triton) against a float64 reference.

The Triton tests run twice over: on CPU tensors under Triton's interpreter (tests/conftest.py
sets TRITON_INTERPRET=1 without CUDA; fp32 and fp16 only, the interpreter gets bf16 wrong) and on
CUDA tensors natively (marked `gpu`, bf16 too, larger shapes). `pytest -m gpu` on a GPU host is
the complete GPU check.
"""

from __future__ import annotations

import fcntl
import hashlib
import math
import os
import tempfile
from pathlib import Path

import pytest
import torch

# plain imports, the Gluon kernels' included: a kernel module that fails to import fails this
# file (and the kernel_tests stage), never turns its tests into skips
from cs336_systems import adapters, model
from cs336_systems.kernels import dispatch
from cs336_systems.kernels import flash_triton as fat
from cs336_systems.kernels.flash_pytorch import (
    FlashAttentionPytorch,
    flash_backward_pytorch,
    flash_forward_pytorch,
)
from cs336_systems.kernels.hopper import configs as hopper_configs
from cs336_systems.kernels.hopper import launch as fh
from cs336_systems.kernels.triton import launch as triton_launch
from cs336_systems.kernels.triton.common import INTERPRET

# the repository (these files also run alone, in the kernel_tests stage)
ROOT = Path(__file__).resolve().parents[3]

HAS_CUDA = torch.cuda.is_available()
F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
# test ids say fp32 / fp16 / bf16, so `-k "not fp16"` does not also drop bf16
DTYPE_IDS = {F32: "fp32", F16: "fp16", BF16: "bf16"}
# (forward atol/rtol, backward atol/rtol) against float64 on the same (rounded) inputs
TOL = {
    F32: (1e-4, 2e-4),
    F16: (5e-3, 1e-2),
    BF16: (3e-2, 6e-2),
}

# (batch, n_queries, n_keys, d): tile-aligned, ragged, n_q != n_k both ways, d not a power of 2
SMALL_SHAPES = [
    (2, 32, 32, 16),
    (2, 37, 37, 32),
    (1, 24, 50, 16),
    (2, 50, 20, 40),
    (1, 1, 1, 16),
    (1, 19, 19, 128),
]
GPU_SHAPES = [
    (4, 128, 128, 64),
    (1, 1000, 1000, 64),
    (2, 777, 1500, 128),
    (1, 1500, 300, 32),
    (2, 2048, 2048, 16),
    (1, 4096, 4096, 128),
]


def _cases(devices_dtypes, shapes_for, triton=True):
    out = []
    for device, dtype in devices_dtypes:
        marks = [pytest.mark.gpu] if device == "cuda" else []
        if triton and device == "cpu" and not INTERPRET:
            marks.append(pytest.mark.skip(reason="CPU tensors need TRITON_INTERPRET=1"))
        for shape in shapes_for(device):
            for causal in (False, True):
                shape_id = "x".join(map(str, shape))
                name = f"{device}-{DTYPE_IDS[dtype]}-{shape_id}-{'causal' if causal else 'full'}"
                out.append(pytest.param(device, dtype, shape, causal, marks=marks, id=name))
    return out


def _shapes(device):
    return SMALL_SHAPES if device == "cpu" else SMALL_SHAPES + GPU_SHAPES


TRITON_CASES = _cases(
    [("cpu", F32), ("cpu", F16), ("cuda", F32), ("cuda", F16), ("cuda", BF16)], _shapes
)
PYTORCH_CASES = _cases(
    [("cpu", F32), ("cpu", BF16), ("cuda", F32), ("cuda", BF16)],
    lambda device: SMALL_SHAPES if device == "cpu" else SMALL_SHAPES + GPU_SHAPES[:3],
    triton=False,
)


@pytest.fixture(scope="module", autouse=True)
def precompiled_triton_kernels(request):
    """On a GPU, first compile the kernel variants the selected Triton tests will autotune over,
    in parallel worker processes (minutes one after another, well under one in parallel)."""
    if not HAS_CUDA or INTERPRET:
        return
    dtypes, head_dims = {F32, BF16}, {16, 64}  # what the unparametrised GPU tests use
    for item in request.session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if params.get("device") == "cuda" and {"dtype", "shape"} <= set(params):
            dtypes.add(params["dtype"])
            head_dims.add(params["shape"][3])
    # under pytest-xdist every worker gets here: the first compiles (in its own pool of
    # processes) and leaves a marker named by the kernels' sources and the selection; the others
    # wait for it and then skip (each re-running precompile, even on a warm Triton cache, took
    # 100-185 s per worker one after another: the kernel_tests stage's minutes on an H100)
    lock_dir = Path(os.environ.get("TRITON_CACHE_DIR") or tempfile.gettempdir())
    lock_dir.mkdir(parents=True, exist_ok=True)
    dtypes, head_dims = sorted(dtypes, key=str), sorted(head_dims)
    digest = hashlib.sha256(repr((dtypes, head_dims)).encode())
    for src in sorted(Path(triton_launch.__file__).parent.rglob("*.py")):
        digest.update(src.read_bytes())
    marker = lock_dir / f".cs336-precompiled-{digest.hexdigest()[:16]}"
    with open(lock_dir / ".cs336-precompile.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists():
            return
        done = triton_launch.precompile(dtypes=dtypes, head_dims=head_dims, causal=(False, True))
        marker.write_text(f"{done['jobs']} kernels in {done['seconds']:.1f} s\n")
    print(f"precompiled {done['jobs']} Triton kernels in {done['seconds']:.1f} s", done["errors"])


def make_inputs(shape, dtype, device, seed=0, scale=1.0, heads=None):
    b, n_q, n_k, d = shape
    g = torch.Generator().manual_seed(seed)
    lead = (b,) if heads is None else (b, heads)

    def rand(n):
        return torch.randn(*lead, n, d, generator=g, dtype=torch.float64)

    q, k, v = rand(n_q) * scale, rand(n_k), rand(n_k)
    do = rand(n_q)
    return [x.to(dtype=dtype, device=device) for x in (q, k, v, do)]


def reference(q, k, v, is_causal):
    """float64 softmax(Q K^T / sqrt(d)) V and its logsumexp; top-left causal (q_idx >= k_idx)."""
    q, k, v = (x.double() for x in (q, k, v))
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if is_causal:
        n_q, n_k = q.shape[-2], k.shape[-2]
        keep = torch.arange(n_q, device=q.device)[:, None] >= torch.arange(n_k, device=q.device)
        s = s.masked_fill(~keep, -math.inf)
    return torch.softmax(s, dim=-1) @ v, torch.logsumexp(s, dim=-1)


def reference_grads(q, k, v, do, is_causal):
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    o, _ = reference(*leaves, is_causal)
    o.backward(do.double())
    return [x.grad for x in leaves]


def assert_close(actual, expected, tol, what):
    torch.testing.assert_close(
        actual.double(), expected.double(), atol=tol, rtol=tol, msg=lambda m: f"{what}: {m}"
    )


def check_forward(fn, q, k, v, causal):
    o, lse = fn(q, k, v, causal)
    o_ref, lse_ref = reference(q, k, v, causal)
    assert o.dtype == q.dtype and o.shape == q.shape
    assert lse.dtype == torch.float32 and lse.shape == q.shape[:-1]
    tol = TOL[q.dtype][0]
    assert_close(o, o_ref, tol, "O")
    assert_close(lse, lse_ref, max(tol, 1e-5), "L")


def check_backward(apply, q, k, v, do, causal):
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    o = apply(*leaves, causal)
    o.backward(do)
    tol = TOL[q.dtype][1]
    for name, x, ref in zip("QKV", leaves, reference_grads(q, k, v, do, causal), strict=True):
        assert x.grad is not None and x.grad.dtype == x.dtype and x.grad.shape == x.shape
        assert_close(x.grad, ref, tol, f"d{name}")


# ----------------------------------------------------------------------------- PyTorch FA2


@pytest.mark.parametrize("device,dtype,shape,causal", PYTORCH_CASES)
def test_pytorch_forward(device, dtype, shape, causal):
    q, k, v, _ = make_inputs(shape, dtype, device)
    check_forward(lambda *a: flash_forward_pytorch(*a, tile_q=16, tile_k=16), q, k, v, causal)


@pytest.mark.parametrize("device,dtype,shape,causal", PYTORCH_CASES)
def test_pytorch_backward(device, dtype, shape, causal):
    q, k, v, do = make_inputs(shape, dtype, device, seed=1)
    check_backward(FlashAttentionPytorch.apply, q, k, v, do, causal)


@pytest.mark.parametrize("tiles", [(16, 16), (16, 32), (32, 16), (64, 128)])
@pytest.mark.parametrize("causal", [False, True])
def test_pytorch_tile_sizes(tiles, causal):
    q, k, v, _ = make_inputs((2, 45, 70, 32), F32, "cpu", seed=2, scale=3.0)
    check_forward(lambda *a: flash_forward_pytorch(*a, *tiles), q, k, v, causal)


def test_pytorch_rejects_small_tiles():
    q, k, v, _ = make_inputs((1, 8, 8, 16), F32, "cpu")
    with pytest.raises(ValueError, match="at least 16"):
        flash_forward_pytorch(q, k, v, tile_q=8)


def test_pytorch_saves_l_for_backward():
    """As the course's test looks for it: exactly one saved tensor shaped (batch, n_queries)."""
    q, k, v, _ = make_inputs((4, 40, 40, 16), F32, "cpu")
    q.requires_grad_()
    o = FlashAttentionPytorch.apply(q, k, v, False)
    saved = o.grad_fn.saved_tensors
    ls = [t for t in saved if t.shape == (4, 40)]
    assert len(ls) == 1 and ls[0].dtype == torch.float32
    assert_close(ls[0], reference(q.detach(), k, v, False)[1], 1e-5, "L")
    assert len(saved) == 5  # Q, K, V, O, L


def test_pytorch_backward_compiles():
    """The backward is one graph for torch.compile (aot_eager: no C++ compiler needed)."""
    q, k, v, do = make_inputs((2, 33, 21, 16), F32, "cpu", seed=3)
    o, lse = flash_forward_pytorch(q, k, v, True)
    compiled = torch.compile(flash_backward_pytorch, backend="aot_eager", fullgraph=True)
    for got, want in zip(
        compiled(q, k, v, o, do, lse, True),
        flash_backward_pytorch(q, k, v, o, do, lse, True),
        strict=True,
    ):
        assert_close(got, want, 1e-6, "compiled backward")


@pytest.mark.gpu
def test_pytorch_backward_inductor_on_gpu():
    q, k, v, do = make_inputs((2, 300, 300, 64), BF16, "cuda", seed=4)
    assert FlashAttentionPytorch.compile_backward
    check_backward(FlashAttentionPytorch.apply, q, k, v, do, True)
    from cs336_systems.kernels import flash_pytorch as fap

    assert fap._compiled_backward is not None


# ----------------------------------------------------------------------------- Triton FA2


@pytest.mark.parametrize("device,dtype,shape,causal", TRITON_CASES)
def test_triton_forward(device, dtype, shape, causal):
    q, k, v, _ = make_inputs(shape, dtype, device)
    check_forward(fat.flash_forward_triton, q, k, v, causal)


@pytest.mark.parametrize("device,dtype,shape,causal", TRITON_CASES)
def test_triton_backward(device, dtype, shape, causal):
    q, k, v, do = make_inputs(shape, dtype, device, seed=1)
    check_backward(fat.FlashAttentionTriton.apply, q, k, v, do, causal)


TILE_CASES = [
    pytest.param(dev, blocks, causal, marks=[pytest.mark.gpu] if dev == "cuda" else [])
    for dev, all_blocks in (("cpu", [(16, 32), (32, 16), (64, 16)]), ("cuda", [(32, 16)]))
    for blocks in all_blocks
    for causal in (False, True)
]


@pytest.mark.parametrize("device,blocks,causal", TILE_CASES)
def test_triton_tile_shapes(device, blocks, causal):
    """Unequal query/key tiles: the causal loop bounds and the masked diagonal tiles."""
    if device == "cpu" and not INTERPRET:
        pytest.skip("CPU tensors need TRITON_INTERPRET=1")
    shape = (1, 70, 45, 32) if device == "cpu" else (2, 300, 517, 64)
    q, k, v, do = make_inputs(shape, F32, device, seed=5, scale=3.0)
    check_forward(lambda *a: fat.flash_forward_triton(*a, blocks=blocks), q, k, v, causal)
    o, lse = fat.flash_forward_triton(q, k, v, causal, blocks=blocks)
    grads = fat.flash_backward_triton(q, k, v, o, do, lse, causal, blocks=blocks)
    for name, got, ref in zip("QKV", grads, reference_grads(q, k, v, do, causal), strict=True):
        assert_close(got, ref, TOL[F32][1], f"d{name}")


DESC_CASES = [
    pytest.param(
        dev,
        dtype,
        use_desc,
        marks=[pytest.mark.gpu] if dev == "cuda" else [],
        id=f"{dev}-{DTYPE_IDS[dtype]}-{'descriptors' if use_desc else 'pointers'}",
    )
    for dev, dtypes in (("cpu", (F32, F16)), ("cuda", (F16, BF16)))
    for dtype in dtypes
    for use_desc in (False, True)
]


@pytest.mark.parametrize("device,dtype,use_desc", DESC_CASES)
@pytest.mark.parametrize("causal", [False, True])
def test_triton_descriptor_and_pointer_paths(device, dtype, use_desc, causal):
    """Tensor descriptors (TMA loads and stores, out-of-range rows zero-filled and clipped) and
    plain pointers give the same results, ragged lengths and n_q != n_k included; so do the
    separate dQ pass and dQ accumulated by the dK/dV pass (bulk reductions or atomics)."""
    if device == "cpu" and not INTERPRET:
        pytest.skip("CPU tensors need TRITON_INTERPRET=1")
    if use_desc and not triton_launch.descriptors_supported():
        pytest.skip("tensor descriptors need Hopper or newer")
    shape = (2, 45, 70, 32) if device == "cpu" else (2, 333, 517, 64)
    blocks = (16, 32) if device == "cpu" else (64, 32)
    q, k, v, do = make_inputs(shape, dtype, device, seed=9, scale=2.0)
    o, lse = fat.flash_forward_triton(q, k, v, causal, blocks=blocks, use_desc=use_desc)
    assert fat.chosen_configs()["forward"]["use_desc"] == use_desc
    o_ref, lse_ref = reference(q, k, v, causal)
    assert_close(o, o_ref, TOL[dtype][0], "O")
    assert_close(lse, lse_ref, TOL[dtype][0], "L")
    refs = reference_grads(q, k, v, do, causal)
    for fuse_dq in (False, True):  # dQ in its own pass, or accumulated by the dK/dV pass
        fat._CHOSEN.clear()
        grads = fat.flash_backward_triton(
            q, k, v, o, do, lse, causal, blocks=blocks, use_desc=use_desc, fuse_dq=fuse_dq
        )
        used = fat.chosen_configs()
        assert set(used) == ({"backward_fused"} if fuse_dq else {"backward_dkdv", "backward_dq"})
        for name, got, ref in zip("QKV", grads, refs, strict=True):
            assert_close(got, ref, TOL[dtype][1], f"d{name} (fuse_dq={fuse_dq})")


def test_triton_descriptors_refused_for_padded_head_dim():
    q, k, v, _ = make_inputs((1, 20, 20, 40), F32, "cpu")
    if not INTERPRET:
        pytest.skip("CPU tensors need TRITON_INTERPRET=1")
    with pytest.raises(ValueError, match="tensor descriptors"):
        fat.flash_forward_triton(q, k, v, True, use_desc=True)


# device-generic Triton checks: on CPU under the interpreter, on CUDA as `gpu` tests
DEVICES = [
    pytest.param(
        "cpu",
        marks=pytest.mark.skipif(not INTERPRET, reason="CPU tensors need TRITON_INTERPRET=1"),
    ),
    pytest.param("cuda", marks=pytest.mark.gpu),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
def test_triton_multihead_noncontiguous(device, causal):
    """(batch, heads, n, d) views of (batch, n, heads, d) tensors, as the model makes them."""
    b, n, h, d = 2, 21, 3, 16
    g = torch.Generator().manual_seed(6)
    base = [torch.randn(b, n, h, d, generator=g).to(device) for _ in range(4)]
    q, k, v, do = (x.transpose(1, 2) for x in base)
    assert not q.is_contiguous()
    leaves = [x.detach().transpose(1, 2).requires_grad_() for x in base[:3]]
    o = fat.flash_attention(*leaves, is_causal=causal)
    assert o.shape == (b, h, n, d)
    assert_close(o, reference(q, k, v, causal)[0], TOL[F32][0], "O")
    o.backward(do)
    for name, x, ref in zip("QKV", leaves, reference_grads(q, k, v, do, causal), strict=True):
        assert_close(x.grad, ref, TOL[F32][1], f"d{name}")


@pytest.mark.parametrize("device", DEVICES)
def test_triton_function_under_torch_compile(device):
    """torch.compile(FlashAttentionTriton.apply), as the course's leaderboard calls it, traces
    one graph (the launchers are custom ops with fake implementations) and gives the eager
    results. aot_eager on CPU (no C++ compiler needed), inductor on the GPU."""
    dtype = F32 if device == "cpu" else BF16
    q, k, v, do = make_inputs((3, 40, 40, 32), dtype, device, seed=11)
    backend = "aot_eager" if device == "cpu" else "inductor"
    compiled = torch.compile(fat.FlashAttentionTriton.apply, backend=backend, fullgraph=True)
    results = []
    for fn in (fat.FlashAttentionTriton.apply, compiled):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        o = fn(*leaves, True)
        o.backward(do)
        results.append([o, *(x.grad for x in leaves)])
    for name, got, want in zip(["O", "dQ", "dK", "dV"], results[1], results[0], strict=True):
        assert_close(got, want, 1e-6 if dtype == F32 else 1e-2, f"{name} compiled vs eager")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("d", [32, 64])
def test_triton_sum_backward_stride_zero_gradient(device, d):
    """o.sum().backward() hands the Function a stride-0 expanded dO (the leaderboard's loss):
    on Hopper at d = 64 both Gluon passes read one row of it through zero strides, elsewhere
    the passes get a dense copy."""
    dtype = F16 if device == "cpu" else BF16
    q, k, v, _ = make_inputs((1, 48, 48, d), dtype, device, seed=10, heads=2)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    fat.FlashAttentionTriton.apply(*leaves, True).sum().backward()
    ones = torch.ones_like(q)
    for name, x, ref in zip("QKV", leaves, reference_grads(q, k, v, ones, True), strict=True):
        assert_close(x.grad, ref, TOL[dtype][1], f"d{name}")


@pytest.mark.parametrize("device", DEVICES)
def test_model_uses_triton_attention(device):
    """model.get_attention_fn('flash_triton') imports and registers the kernel; a tiny model
    gives the same logits and gradients with it as with naive attention."""
    fn = model.get_attention_fn("flash_triton")
    assert fn is fat.flash_attention and model.ATTENTION_FUNCTIONS["flash_triton"] is fn
    torch.manual_seed(0)
    lm = model.TransformerLM(
        vocab_size=50, context_length=24, d_model=32, num_layers=1, num_heads=2, d_ff=64
    ).to(device)
    tokens = torch.randint(0, 50, (2, 24), device=device)
    logits_naive = lm(tokens)
    grads_naive = torch.autograd.grad(logits_naive.square().mean(), list(lm.parameters()))
    lm.set_attention("flash_triton")
    logits_flash = lm(tokens)
    grads_flash = torch.autograd.grad(logits_flash.square().mean(), list(lm.parameters()))
    assert_close(logits_flash, logits_naive, 1e-4, "logits")
    for gf, gn in zip(grads_flash, grads_naive, strict=True):
        assert_close(gf, gn, 1e-4, "parameter gradient")


def test_causal_convention_is_top_left():
    """Top-left causal (q_idx >= k_idx), as the course's reference and SDPA's is_causal; the
    model's naive_attention aligns bottom-right, which agrees only when n_queries == n_keys."""
    q, k, v, _ = make_inputs((1, 20, 20, 16), F32, "cpu")
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for q_ in (q, q[:, :8]):
        o, _ = flash_forward_pytorch(q_, k, v, True, 16, 16)
        assert_close(o, reference(q_, k, v, True)[0], 1e-5, "top-left reference")
        assert_close(o, sdpa(q_, k, v, is_causal=True), 1e-5, "SDPA is_causal")
    assert_close(model.naive_attention(q, k, v), sdpa(q, k, v, is_causal=True), 1e-5, "square")
    bottom_right = model.naive_attention(q[:, :8], k, v)
    assert (bottom_right - sdpa(q[:, :8], k, v, is_causal=True)).abs().max() > 1e-2


# ----------------------------------------------------------------------------- bad input


def _bad_inputs():
    def t(*shape, dtype=F32):
        return torch.randn(*shape).to(dtype)

    return {
        "batch": (t(2, 8, 16), t(3, 8, 16), t(3, 8, 16)),
        "heads": (t(2, 4, 8, 16), t(2, 2, 8, 16), t(2, 2, 8, 16)),
        "rank": (t(2, 8, 16), t(2, 1, 8, 16), t(2, 1, 8, 16)),
        "keys": (t(2, 8, 16), t(2, 9, 16), t(2, 10, 16)),
        "head_dim": (t(2, 8, 16), t(2, 8, 32), t(2, 8, 32)),
        "too_wide": (t(1, 8, 256), t(1, 8, 256), t(1, 8, 256)),
        "mixed_dtype": (t(2, 8, 16), t(2, 8, 16, dtype=F16), t(2, 8, 16)),
        "float64": (t(2, 8, 16, dtype=torch.float64),) * 3,
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(_bad_inputs()))
def test_triton_rejects_bad_input(case, device):
    q, k, v = (x.to(device) for x in _bad_inputs()[case])
    with pytest.raises(ValueError, match=r"q \(") as err:
        fat.FlashAttentionTriton.apply(q, k, v, True)
    assert str(tuple(q.shape)) in str(err.value)


@pytest.mark.parametrize("case", ["batch", "heads", "rank", "keys", "head_dim", "mixed_dtype"])
def test_pytorch_rejects_bad_input(case):
    q, k, v = _bad_inputs()[case]
    with pytest.raises(ValueError, match=r"q \("):
        FlashAttentionPytorch.apply(q, k, v, True)


def test_multihead_entry_wants_4d():
    q = torch.randn(2, 8, 16)
    with pytest.raises(ValueError, match="batch, heads, n, d"):
        fat.flash_attention(q, q, q)


@pytest.mark.gpu
def test_triton_rejects_cpu_tensors_on_gpu_host():
    q = torch.randn(1, 8, 16)
    with pytest.raises(ValueError, match="CUDA"):
        fat.FlashAttentionTriton.apply(q, q, q)


# ----------------------------------------------------------------------------- interface, GPU


def test_adapters_return_the_classes():
    assert adapters.get_flashattention_autograd_function_pytorch() is FlashAttentionPytorch
    assert adapters.get_flashattention_autograd_function_triton() is fat.FlashAttentionTriton


@pytest.mark.parametrize("device", DEVICES)
def test_chosen_configs_recorded(device):
    q, k, v, do = make_inputs((1, 40, 40, 16), F32, device)
    q.requires_grad_()
    fat.FlashAttentionTriton.apply(q, k, v, True).backward(do)
    chosen = fat.chosen_configs()
    assert set(chosen) >= {"forward", "backward_dkdv", "backward_dq"}
    for cfg in chosen.values():
        assert cfg["BLOCK_Q"] >= 16 and cfg["BLOCK_K"] >= 16
        assert cfg["autotuned"] == (device == "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_triton_tf32_when_allowed(causal):
    """fp32 inputs use TF32 tensor cores only when torch's matmul precision allows it."""
    q, k, v, do = make_inputs((2, 1024, 1024, 64), F32, "cuda", seed=7)
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        o, lse = fat.flash_forward_triton(q, k, v, causal)
        grads = fat.flash_backward_triton(q, k, v, o, do, lse, causal)
    finally:
        torch.set_float32_matmul_precision(previous)
    assert_close(o, reference(q, k, v, causal)[0], 1e-2, "O (tf32)")
    for name, got, ref in zip("QKV", grads, reference_grads(q, k, v, do, causal), strict=True):
        assert_close(got, ref, 3e-2, f"d{name} (tf32)")


@pytest.mark.gpu
def test_triton_leaderboard_shape_against_sdpa():
    """B=1, H=16, n=16384, d=64, bf16 causal: forward and gradients agree with SDPA's flash."""
    q, k, v, do = make_inputs((1, 16384, 16384, 64), BF16, "cuda", seed=8, heads=16)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    o = fat.flash_attention(*leaves, is_causal=True)
    o.backward(do)
    ref_leaves = [x.float().requires_grad_() for x in (q, k, v)]
    o_ref = torch.nn.functional.scaled_dot_product_attention(*ref_leaves, is_causal=True)
    o_ref.backward(do.float())
    assert_close(o, o_ref, 2e-2, "O")
    for name, x, ref in zip("QKV", leaves, ref_leaves, strict=True):
        assert_close(x.grad, ref.grad, 5e-2, f"d{name}")


@pytest.mark.gpu
def test_triton_under_compiled_model():
    """A torch.compile'd model calls the kernel through a graph break and stays correct."""
    torch.manual_seed(0)
    lm = model.build_model("tiny", context_length=128).cuda()
    tokens = torch.randint(0, model.VOCAB_SIZE, (2, 128), device="cuda")
    expected = lm(tokens)
    lm.set_attention("flash_triton")
    compiled = torch.compile(lm)
    got = compiled(tokens)
    got.float().square().mean().backward()
    assert_close(got, expected, 1e-3, "compiled model logits")


# ----------------------------------------------------------------------------- Gluon (Hopper)


def test_hopper_kernels_compile_for_sm90_with_their_overlap():
    """Without a GPU: the Gluon kernels build for sm_90 with this Triton (its own ptxas), spill
    no registers, load through TMA, and keep the schedule they exist for: the forward waits for
    the scores with one product (P V) still in flight; the dK/dV pass waits for S^T with three
    in flight, then for dP^T with two; and ptxas kept those waits as written instead of
    serialising every product (it does when products stay in flight across a loop's back
    edge, as an earlier dK/dV pass had them); the dQ pass waits for S with two products in
    flight (dP and the previous tile's dQ), then for dP with one. Every pass the dispatch routes
    to Gluon on Hopper, at any head dim, is among the builds: a routed kernel that does not
    compile fails here. Runs in a child process: Gluon cannot be compiled while TRITON_INTERPRET
    is set, as it is for the CPU tests."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests/tools/inspect_sm90.py"), "64", "128", "--routed"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    reports = json.loads(done.stdout.strip().splitlines()[-1])
    # three kernels per head dim with their tiles, the other routed passes (the dK/dV passes at
    # d = 16, 32), then the one-warpgroup dK/dV pass fusing dQ (d = 64)
    assert len(reports) == 9
    built = {(r["kernel"], r["head_dim"]) for r in reports}
    for d in hopper_configs.HEAD_DIMS:
        plan = dispatch.plan(BF16, d, dispatch.HOPPER)
        routed = [p for p in (plan.forward, plan.dkdv, plan.dq) if p is not None and p.gluon]
        assert routed and {(p.name, d) for p in routed} <= built, plan.describe()
    for j, r in enumerate(reports):
        plain_fused = j == len(reports) - 1
        expected = {"forward": {1}, "backward_dkdv": {3, 2}, "backward_dq": {2, 1}}[r["kernel"]]
        if plain_fused:  # S^T with four products in flight, dP^T with three
            expected = {4, 3}
        serial = (r["kernel"], r["head_dim"]) == ("backward_dkdv", 128)
        if serial:  # SERIAL: S^T waited for with dP^T in flight, then everything
            expected = {1, 0}
        # dQ inside the dK/dV pass: as routed at d = 64 (a dQ warpgroup) and 128 (in the
        # consumers), and the plain one
        assert r["fused_dq"] == (r["kernel"] == "backward_dkdv" and r["head_dim"] in (64, 128)), r
        assert r["tma_reductions"] == r["fused_dq"], r
        assert expected <= set(r["wgmma_waits"]), r
        # and ptxas kept those products asynchronous (no wait added after each one)
        assert not r["wgmma_serialized"], r
        # warp-specialized (a producer warp and consumer warpgroups): both forwards, every dQ
        # pass and the routed d = 64 dK/dV pass
        ws = (
            r["kernel"] in ("forward", "backward_dq")
            or r["kernel"] == "backward_dkdv"
            and r["head_dim"] in (64, 128)
        )
        assert r["warp_specialized"] == (ws and not plain_fused), r
        # no spills but scalars: ptxas keeps four values (16 bytes) of the d = 64
        # warp-specialized dK/dV consumer on the stack at its 240 registers, and 28 (112 bytes)
        # of the d = 128 SERIAL consumers, which hold 64 x 128 dK and dV accumulators each (24
        # before their launch order was renumbered, HEADS_TOGETHER, as built here: long sequences)
        spill = 0
        if r["warp_specialized"] and r["kernel"] == "backward_dkdv":
            spill = 112 if serial else 16
        assert r["tma_loads"] and r["stack_bytes"] <= spill and r["local_bytes"] == 0, r
        assert r["shared_bytes"] <= 227 * 1024, r


@pytest.mark.gpu
@pytest.mark.parametrize("d", [32, 64, 128])
@pytest.mark.parametrize(
    "config",
    [
        (128, 64, 8, 3),
        (128, 128, 4, 2, {"WS": True}),
        (128, 128, 4, 2, {"WS": True, "PINGPONG": True}),
        (192, 128, 4, 2, {"WS": True, "PINGPONG": True}),
    ],
    ids=["plain", "ws2", "ws2_pingpong", "ws3_pingpong"],
)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n_q, n_k", [(777, 1500), (1500, 333)])
def test_hopper_forward_variants_against_float64(d, config, causal, n_q, n_k):
    """Both Gluon forwards (one warpgroup pair in lockstep, and the warp-specialized one with a
    producer warp and two or three consumer warpgroups, taking turns or not) at every head dim
    they serve, ragged, n_q < n_k and n_q > n_k."""
    fh = _hopper_gpu()
    if config[0] == 192 and d == 128:  # three consumers' registers hold 64-key tiles only
        config = (192, 64, *config[2:])
    g = torch.Generator(device="cuda").manual_seed(d + n_q)
    q = torch.randn(2, 3, n_q, d, device="cuda", dtype=BF16, generator=g)
    k, v = (torch.randn(2, 3, n_k, d, device="cuda", dtype=BF16, generator=g) for _ in "kv")
    o, lse = fh.forward(q, k, v, causal, config=config)
    o_ref, lse_ref = reference(q, k, v, causal)
    assert_close(o, o_ref, TOL[BF16][0], "O")
    assert_close(lse, lse_ref, 1e-3, "L")


def _hopper_gpu():
    if not HAS_CUDA or not dispatch.target_of(torch.device("cuda")).hopper:
        pytest.skip("needs a Hopper GPU")
    return fh


@pytest.mark.gpu
@pytest.mark.parametrize("d", [16, 32, 64, 128])
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_hopper_kernels_against_float64(d, dtype, causal):
    """Every head dim through the Gluon forward, dK/dV and dQ kernels (use_gluon=True), on ragged
    lengths with n_q != n_k and a transposed (b, n, h, d) layout."""
    _hopper_gpu()
    g = torch.Generator(device="cuda").manual_seed(d)
    q = torch.randn(2, 777, 3, d, device="cuda", dtype=dtype, generator=g).transpose(1, 2)
    k, v = (torch.randn(2, 3, 1500, d, device="cuda", dtype=dtype, generator=g) for _ in "kv")
    do = torch.randn(2, 3, 777, d, device="cuda", dtype=dtype, generator=g)
    o, lse = fat.flash_forward_triton(q, k, v, causal, use_gluon=True)
    assert fat.chosen_configs()["forward"]["kernel"] == "gluon"
    o_ref, lse_ref = reference(q, k, v, causal)
    assert_close(o, o_ref, TOL[dtype][0], "O")
    assert_close(lse, lse_ref, 1e-3, "L")
    grads = fat.flash_backward_triton(q, k, v, o, do, lse, causal, use_gluon=True)
    assert fat.chosen_configs()["backward_dkdv"]["kernel"] == "gluon"
    if hopper_configs.fuses_dq(d):  # the dK/dV pass computed dQ as well
        assert "backward_dq" not in fat.chosen_configs()
    else:
        assert fat.chosen_configs()["backward_dq"]["kernel"] == "gluon"
    for name, got, ref in zip("QKV", grads, reference_grads(q, k, v, do, causal), strict=True):
        assert_close(got, ref, TOL[dtype][1], f"d{name}")


@pytest.mark.gpu
@pytest.mark.parametrize("d", [32, 64, 128])
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n_q, n_k", [(777, 1500), (1500, 333)])
@pytest.mark.parametrize(
    "config",
    [
        "plain",
        (64, 128, 4, 3, {"WS": True, "FUSE_DQ": True}),
        (64, 128, 4, 2, {"WS": True, "FUSE_DQ": True, "SERIAL": True, "DS_BUFS": 2}),
    ],
    ids=["plain", "ws", "ws_serial"],
)
def test_hopper_fused_dq_against_float64(d, dtype, causal, n_q, n_k, config, monkeypatch):
    """The dK/dV pass that also computes dQ (TMA reductions from every key tile into one fp32
    tensor), routed in place of the two passes: ragged, n_q < n_k and n_q > n_k; plain (one
    warpgroup), warp-specialized with a dQ warpgroup beside the two consumers (d <= 64), and
    warp-specialized with each consumer computing half of dQ's columns (SERIAL, every d)."""
    _hopper_gpu()
    if d == 128 and not (isinstance(config, tuple) and config[4].get("SERIAL")):
        pytest.skip("at d = 128 only the SERIAL form fits its registers")
    monkeypatch.setitem(
        hopper_configs.DKDV_CONFIGS,
        d,
        hopper_configs.FUSED_DQ_CONFIG if config == "plain" else config,
    )
    g = torch.Generator(device="cuda").manual_seed(d + n_q)
    q, do = (torch.randn(2, 3, n_q, d, device="cuda", dtype=dtype, generator=g) for _ in "qo")
    k, v = (torch.randn(2, 3, n_k, d, device="cuda", dtype=dtype, generator=g) for _ in "kv")
    o, lse = fat.flash_forward_triton(q, k, v, causal)
    grads = fat.flash_backward_triton(q, k, v, o, do, lse, causal, use_gluon=True)
    assert "backward_dq" not in fat.chosen_configs()  # no separate dQ pass ran
    for name, got, ref in zip("QKV", grads, reference_grads(q, k, v, do, causal), strict=True):
        assert_close(got, ref, TOL[dtype][1], f"d{name}")


@pytest.mark.gpu
@pytest.mark.parametrize("d", [32, 64, 128])
@pytest.mark.parametrize(
    "config", [(192, 64, 4, 3, {"WS": True}), (128, 64, 4, 3, {"WS": True})], ids=["ws3", "ws2"]
)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n_q, n_k", [(777, 1500), (1500, 333)])
def test_hopper_dq_variants_against_float64(d, config, causal, n_q, n_k):
    """The Gluon dQ pass (warp-specialized) with three and with two consumer warpgroups, at
    several head dims, ragged, n_q < n_k and n_q > n_k; given D, and computing D itself; a
    configuration without the WS switch is refused."""
    fh = _hopper_gpu()
    if d == 128 and config[0] == 192:  # three Q, dO and O tiles of 128 columns: 2 stages fit
        config = (192, 64, 4, 2, {"WS": True})
    g = torch.Generator(device="cuda").manual_seed(d + n_q)
    q, do = (torch.randn(2, 3, n_q, d, device="cuda", dtype=BF16, generator=g) for _ in "qo")
    k, v = (torch.randn(2, 3, n_k, d, device="cuda", dtype=BF16, generator=g) for _ in "kv")
    o, lse = fat.flash_forward_triton(q, k, v, causal)
    delta = (o.float() * do.float()).sum(-1).contiguous()
    dq_ref = reference_grads(q, k, v, do, causal)[0]
    dq = torch.full_like(q, float("nan"))
    fh.backward_dq(q, k, v, do, lse, delta, dq, causal, config=config)
    assert_close(dq, dq_ref, TOL[BF16][1], "dQ")
    # and computing D itself from O (as routed), into a buffer that starts as garbage
    own = torch.full_like(delta, float("nan"))
    dq = torch.full_like(q, float("nan"))
    fh.backward_dq(q, k, v, do, lse, own, dq, causal, config=config, o=o)
    torch.testing.assert_close(own, delta, atol=1e-3, rtol=1e-3)
    assert_close(dq, dq_ref, TOL[BF16][1], "dQ (own D)")
    with pytest.raises(ValueError, match="warp-specialized"):
        fh.backward_dq(q, k, v, do, lse, delta, dq, causal, config=config[:4])


def test_heads_together_applies_from_the_tiles_a_head_has():
    """The launcher keeps a config's HEADS_TOGETHER only where each head has at least
    TOGETHER_MIN_TILES programs (long sequences), and launches in the grid's order (0) below,
    where every head's heaviest programs must start first; a config without it is left alone."""
    grouped = {"BLOCK_M": 64, "HEADS_TOGETHER": 2}
    enough = fh.TOGETHER_MIN_TILES
    assert fh._launch_order(grouped, enough) == grouped
    assert fh._launch_order(grouped, enough - 1) == {"BLOCK_M": 64, "HEADS_TOGETHER": 0}
    assert grouped["HEADS_TOGETHER"] == 2  # the config's own dict is not changed
    assert fh._launch_order({"BLOCK_M": 64}, 1) == {"BLOCK_M": 64}
    # as routed: 16384 queries give the d = 64 forward 86 programs a head, 4096 give 22
    q = torch.empty(1, 2, 16384, 64, dtype=BF16)
    lse = torch.empty(1, 2, 16384)
    _, grid, _, constants = fh._forward_call(q, q, q, q, lse, True)
    assert grid == (2, 86) and constants["HEADS_TOGETHER"] == 2
    short = q[:, :, :4096]
    _, grid, _, constants = fh._forward_call(short, short, short, short, lse[..., :4096], True)
    assert grid == (2, 22) and constants["HEADS_TOGETHER"] == 0


HEADS_TOGETHER_CASES = {
    # (head dim, forward config, dK/dV config): each Gluon kernel kind as routed or tested
    "d32_lockstep_plain": (32, (128, 64, 8, 3), (64, 64, 4, 3)),
    "d64_routed": (64, None, None),
    "d128_routed": (128, None, None),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(HEADS_TOGETHER_CASES))
@pytest.mark.parametrize("together", [1, 4])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n_q, n_k", [(777, 1500), (1500, 333)])
def test_hopper_heads_together_against_float64(case, together, causal, n_q, n_k, monkeypatch):
    """The forward and the dK/dV pass with their programs renumbered so that `together` heads
    run at a time (HEADS_TOGETHER), on 2 x 3 (batch x heads) = 6 rows of programs, so that with
    4 the last group holds 2: every program still computes one tile once (outputs and gradients
    against float64), ragged, n_q < n_k and n_q > n_k."""
    _hopper_gpu()
    monkeypatch.setattr(fh, "TOGETHER_MIN_TILES", 1)  # renumbered at these short lengths too
    d, fwd, dkdv = HEADS_TOGETHER_CASES[case]
    for table, config in (
        (hopper_configs.FORWARD_CONFIGS, fwd),
        (hopper_configs.DKDV_CONFIGS, dkdv),
    ):
        config = config or table[d]
        switches = {**(config[4] if len(config) > 4 else {}), "HEADS_TOGETHER": together}
        monkeypatch.setitem(table, d, (*config[:4], switches))
    g = torch.Generator(device="cuda").manual_seed(d + n_q + together)
    q, do = (torch.randn(2, 3, n_q, d, device="cuda", dtype=BF16, generator=g) for _ in "qo")
    k, v = (torch.randn(2, 3, n_k, d, device="cuda", dtype=BF16, generator=g) for _ in "kv")
    o, lse = fat.flash_forward_triton(q, k, v, causal, use_gluon=True)
    chosen = fat.chosen_configs()["forward"]
    assert (chosen["kernel"], chosen["heads_together"]) == ("gluon", together)
    o_ref, lse_ref = reference(q, k, v, causal)
    assert_close(o, o_ref, TOL[BF16][0], "O")
    assert_close(lse, lse_ref, TOL[BF16][0], "L")
    grads = fat.flash_backward_triton(q, k, v, o, do, lse, causal, use_gluon=True)
    chosen = fat.chosen_configs()["backward_dkdv"]
    assert (chosen["kernel"], chosen["heads_together"]) == ("gluon", together)
    for name, got, ref in zip("QKV", grads, reference_grads(q, k, v, do, causal), strict=True):
        assert_close(got, ref, TOL[BF16][1], f"d{name}")


@pytest.mark.gpu
@pytest.mark.parametrize("d", [32, 64, 128])
@pytest.mark.parametrize(
    "config",
    [
        (64, 128, 4, 3, {"WS": True, "A_IN_REGS": True}),
        (64, 128, 4, 3, {"WS": True}),
        (64, 128, 4, 2, {"WS": True, "SERIAL": True}),
    ],
    ids=["ws_a_in_regs", "ws", "ws_serial"],
)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n_q, n_k", [(777, 1500), (1500, 333)])
def test_hopper_ws_dkdv_against_float64(d, config, causal, n_q, n_k):
    """The warp-specialized dK/dV pass (two consumer warpgroups of 64 keys sharing each Q and
    dO tile), with K and V as register operands and without, and with each tile's products
    waited for within the tile (SERIAL), ragged, n_q < n_k and n_q > n_k
    (key tiles whose second half lies past n_k, query tiles that see only one half)."""
    fh = _hopper_gpu()
    if d == 128 and config[4].get("A_IN_REGS"):
        pytest.skip("spills at d = 128")
    g = torch.Generator(device="cuda").manual_seed(d + n_k)
    q, do = (torch.randn(2, 3, n_q, d, device="cuda", dtype=BF16, generator=g) for _ in "qo")
    k, v = (torch.randn(2, 3, n_k, d, device="cuda", dtype=BF16, generator=g) for _ in "kv")
    o, lse = fat.flash_forward_triton(q, k, v, causal)
    delta = (o.float() * do.float()).sum(-1).contiguous()
    dk, dv = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
    fh.backward_dkdv(q, k, v, do, lse, delta, dk, dv, causal, config=config)
    _, dk_ref, dv_ref = reference_grads(q, k, v, do, causal)
    assert_close(dk, dk_ref, TOL[BF16][1], "dK")
    assert_close(dv, dv_ref, TOL[BF16][1], "dV")
