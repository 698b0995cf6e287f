"""The leaderboard's rules: the 10-minute budget, the breakdown's classes, the FLOP count."""

from __future__ import annotations

import pytest

from cs336_systems.core.costs import matmul_param_count, train_step_flops
from cs336_systems.engine.budget import benchmark_seconds, breakdown, classify, fits_budget


def test_budget_counts_setup_and_do_bench_phases():
    assert benchmark_seconds(100.0, 5.0) == pytest.approx(140.0)
    assert fits_budget(559.0, 4000.0)  # 559 + 10 + 30 = 599 s
    assert not fits_budget(561.0, 4000.0)


def test_a_step_longer_than_do_bench_phases_counts_whole_steps():
    # an 8B step of 40 s: do_bench still runs one warm-up and one measured step
    assert benchmark_seconds(0.0, 40_000.0) == pytest.approx(80.0)
    with pytest.raises(ValueError):
        benchmark_seconds(1.0, 0.0)


@pytest.mark.parametrize(
    "name, part",
    [
        ("aten::mm", "matmul"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32", "matmul"),
        ("_attn_fwd_kernel", "attention"),
        ("aten::_softmax", "attention"),
        ("_LinearCrossEntropyBackward", "loss"),
        ("aten::logsumexp", "loss"),
        ("aten::_fused_adamw_", "optimizer"),
        ("ncclDevKernel_ReduceScatter_Sum_bf16", "communication"),
        ("gloo:all_gather", "communication"),
        ("aten::add_", "other"),
    ],
)
def test_classify(name, part):
    assert classify(name) == part


def test_breakdown_sums_per_part():
    out = breakdown([("aten::mm", 2.0), ("aten::addmm", 1.0), ("aten::add", 0.5)])
    assert out["matmul"] == 3.0 and out["other"] == 0.5 and out["loss"] == 0.0


def test_the_8b_step_count():
    """7.5 B matmul parameters; 6 N x 65,536 tokens plus causal attention over 34 layers."""
    n = matmul_param_count(151_936, 4096, 34, 11_008)
    assert n == pytest.approx(7.5e9, rel=0.01)
    flops = train_step_flops(151_936, 4096, 34, 11_008, 2, 32_768)
    attention = 34 * 2 * 3.5 * 4 * 32_768**2 * 4096 / 2
    assert flops == pytest.approx(6 * n * 65_536 + attention)
    assert 4.9e15 < flops < 5.1e15
