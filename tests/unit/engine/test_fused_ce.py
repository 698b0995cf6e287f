"""The fused LM-head cross-entropy against F.cross_entropy on the full logits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cs336_systems.engine.fused_ce import chunk_for, linear_cross_entropy


def _inputs(t=37, d=16, v=53, seed=0, ignore=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(t, d, generator=g)
    w = torch.randn(v, d, generator=g) / d**0.5
    y = torch.randint(0, v, (t,), generator=g)
    if ignore:
        y[:ignore] = -100
    return h, w, y


def _grads(loss_fn, h, w, y):
    h = h.clone().requires_grad_()
    w = w.clone().requires_grad_()
    loss = loss_fn(h, w, y)
    loss.backward()
    return loss.detach(), h.grad, w.grad


def _reference(h, w, y):
    return F.cross_entropy((h @ w.T).float(), y)


@pytest.mark.parametrize("chunk", [1, 8, 10, 37, 64])  # 37 tokens: a ragged last chunk
def test_fp32_matches_cross_entropy(chunk):
    h, w, y = _inputs()
    ref = _grads(_reference, h, w, y)
    out = _grads(lambda h, w, y: linear_cross_entropy(h, w, y, chunk=chunk), h, w, y)
    for a, b in zip(out, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_vocab_not_a_multiple_of_the_chunk_and_3d_hidden():
    h, w, y = _inputs(t=24, v=1001)
    h3, y3 = h.view(4, 6, -1), y.view(4, 6)
    ref = _grads(lambda h, w, y: F.cross_entropy((h @ w.T).flatten(0, 1), y.flatten()), h3, w, y3)
    out = _grads(lambda h, w, y: linear_cross_entropy(h, w, y, chunk=7), h3, w, y3)
    for a, b in zip(out, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_ignore_index():
    h, w, y = _inputs(ignore=5)
    ref = _grads(_reference, h, w, y)
    out = _grads(lambda h, w, y: linear_cross_entropy(h, w, y, chunk=6), h, w, y)
    for a, b in zip(out, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert out[1][:5].abs().max() == 0  # ignored tokens get no gradient


def test_bf16_autocast_matches_autocast_reference():
    """Under autocast both compute the matmuls in bf16 and the softmax in fp32; the gradients
    differ by bf16 rounding of g (before the matmuls) only: loss to 1e-3, grads to 2e-2."""
    h, w, y = _inputs(t=64, d=32, v=300)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = _grads(_reference, h, w, y)
        out = _grads(lambda h, w, y: linear_cross_entropy(h, w, y, chunk=24), h, w, y)
    assert out[1].dtype == ref[1].dtype == torch.float32  # grads of the fp32 leaves
    torch.testing.assert_close(out[0], ref[0], rtol=1e-3, atol=1e-3)
    for a, b in zip(out[1:], ref[1:], strict=True):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-3)


def test_a_wrong_target_changes_the_loss():
    h, w, y = _inputs()
    base = linear_cross_entropy(h, w, y, chunk=8)
    y2 = y.clone()
    y2[0] = (y2[0] + 1) % w.shape[0]
    assert not torch.equal(base, linear_cross_entropy(h, w, y2, chunk=8))


def test_chunk_for_bounds_the_chunk_logits():
    assert chunk_for(151_936, 512 * 2**20) == 512 * 2**20 // (4 * 151_936)
    assert chunk_for(10**12, 1) == 1


def test_shape_mismatch_is_refused():
    h, w, y = _inputs()
    with pytest.raises(ValueError, match="targets"):
        linear_cross_entropy(h, w, y[:-1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bf16_large_vocab():
    torch.manual_seed(0)
    h = torch.randn(512, 256, device="cuda")
    w = torch.randn(50_257, 256, device="cuda") / 16
    y = torch.randint(0, 50_257, (512,), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ref = _grads(_reference, h, w, y)
        out = _grads(lambda h, w, y: linear_cross_entropy(h, w, y, chunk=100), h, w, y)
    torch.testing.assert_close(out[0], ref[0], rtol=1e-3, atol=1e-3)
    for a, b in zip(out[1:], ref[1:], strict=True):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-3)
