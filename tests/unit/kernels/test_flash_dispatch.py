"""The dispatch of the FlashAttention kernels (`kernels.dispatch.plan`): which kernel runs each
pass, with which tiles, and why; that the autograd Function follows the plan; and that a Gluon
kernel that fails to import is an error, not a silent fallback. CPU only: the plans of GPU
targets are computed, not run (tests/unit/kernels/test_flash_attention.py runs the kernels)."""

from __future__ import annotations

import sys

import pytest
import torch

# plain imports: a kernel module that fails to import fails this file, never skips it
from cs336_systems.kernels import dispatch
from cs336_systems.kernels import flash_triton as fat
from cs336_systems.kernels.hopper import configs as hopper_configs
from cs336_systems.kernels.triton.common import INTERPRET

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


@pytest.fixture(autouse=True)
def _fresh_programs():
    """Tests here stand fakes in for the Gluon launchers: the kept programs (which hold the
    launchers they were built with) are forgotten around each test."""
    fat.clear_programs()
    yield
    fat.clear_programs()


def _inputs(shape, dtype, device, heads=None):
    """Q, K, V, dO of (batch, [heads,] n, d) for shape (batch, n_q, n_k, d)."""
    b, n_q, n_k, d = shape
    g = torch.Generator().manual_seed(0)
    lead = (b,) if heads is None else (b, heads)
    sizes = (n_q, n_k, n_k, n_q)
    return [torch.randn(*lead, n, d, generator=g).to(dtype=dtype, device=device) for n in sizes]


def test_plan_on_hopper_routes_d64_to_the_warp_specialized_gluon_kernels():
    plan = dispatch.plan(BF16, 64, dispatch.HOPPER)
    assert plan.forward.gluon and plan.forward.kernel == "_attn_fwd_ws_kernel"
    assert plan.forward.tiles == hopper_configs.FORWARD_CONFIGS[64]
    assert plan.dkdv.gluon and plan.dkdv.kernel == "_attn_bwd_dkdv_ws_kernel"
    assert plan.dkdv.tiles == hopper_configs.DKDV_CONFIGS[64]
    # FUSE_DQ: the dK/dV pass computes dQ, after the Triton-language D kernel
    assert plan.dq is None and plan.fused_dq and plan.gluon_backward
    assert [p.name for p in plan.backward] == ["preprocess", "backward_dkdv"]
    assert plan.delta.backend == "triton"
    assert "routed at d = 64" in plan.forward.reason and "routed" in plan.dkdv.reason


@pytest.mark.parametrize("d", [16, 32])
def test_plan_on_hopper_at_other_head_dims(d):
    plan = dispatch.plan(F16, d, dispatch.HOPPER)
    assert plan.forward.gluon == (d in hopper_configs.FORWARD_CONFIGS)
    assert plan.dkdv.gluon and plan.dkdv.kernel == "_attn_bwd_dkdv_kernel"
    # the Triton-language dQ pass, autotuned, after the D kernel
    assert plan.dq is not None and not plan.dq.gluon and plan.dq.tiles is None
    assert "not routed" in plan.dq.reason and not plan.gluon_backward


def test_plan_on_hopper_at_d128_computes_dq_in_the_dkdv_consumers():
    """d = 128: the Gluon forward, the D kernel, then the warp-specialized Gluon dK/dV pass whose
    two consumer warpgroups compute dQ too (SERIAL and FUSE_DQ): no dQ pass."""
    plan = dispatch.plan(BF16, 128, dispatch.HOPPER)
    assert plan.forward.gluon and plan.forward.tiles == hopper_configs.FORWARD_CONFIGS[128]
    assert plan.dkdv.gluon and plan.dkdv.kernel == "_attn_bwd_dkdv_ws_kernel"
    assert plan.dkdv.tiles == hopper_configs.DKDV_CONFIGS[128]
    assert plan.dkdv.tiles[4]["SERIAL"] and "routed at d = 128" in plan.dkdv.reason
    assert plan.dq is None and plan.fused_dq and plan.gluon_backward
    assert [p.name for p in plan.backward] == ["preprocess", "backward_dkdv"]


@pytest.mark.parametrize(
    "target, dtype, d, why",
    [
        (dispatch.INTERPRETER, F16, 64, "interpreter"),
        (dispatch.Target("cuda", (8, 0)), BF16, 64, "sm_80"),
        (dispatch.Target("cuda", (10, 0)), BF16, 64, "sm_100"),
        (dispatch.HOPPER, F32, 64, "fp32"),
        (dispatch.HOPPER, BF16, 40, "d = 40"),
    ],
    ids=["interpreter", "ampere", "blackwell", "float32", "d40"],
)
def test_plan_falls_back_to_triton_for_a_named_reason(target, dtype, d, why):
    plan = dispatch.plan(dtype, d, target)
    for p in (plan.forward, plan.dkdv, plan.dq):
        assert p.backend == "triton" and why in p.reason, p
        if target == dispatch.INTERPRETER:  # the interpreter's small fixed tiles
            assert p.tiles == (16, 16)
        else:  # autotuned
            assert p.tiles is None
    assert plan.delta.backend == "triton"


@pytest.mark.parametrize(
    "option, why",
    [
        ({"use_gluon": False}, "use_gluon=False"),
        ({"blocks": (64, 64)}, "tiles given"),
        ({"use_desc": False}, "use_desc=False"),
        ({"fuse_dq": True}, "fuse_dq=True"),
    ],
    ids=["use_gluon", "blocks", "use_desc", "fuse_dq"],
)
def test_plan_call_options_turn_gluon_off(option, why):
    plan = dispatch.plan(BF16, 64, dispatch.HOPPER, **option)
    assert not plan.dkdv.gluon and why in plan.dkdv.reason
    if "fuse_dq" in option:  # the Triton-language pass that computes dQ too
        assert plan.dkdv.name == "backward_fused" and plan.dq is None
    else:
        assert not plan.forward.gluon and why in plan.forward.reason


def test_plan_layout_and_environment_turn_gluon_off(monkeypatch):
    rows = torch.empty(1, 2, 64, 73, dtype=BF16)[..., :64]  # 146-byte rows: not 16-byte aligned
    plan = dispatch.plan(BF16, 64, dispatch.HOPPER, tensors=(rows, rows, rows))
    assert not plan.forward.gluon and "TMA" in plan.forward.reason
    monkeypatch.setenv("CS336_FLASH_GLUON", "0")
    plan = dispatch.plan(BF16, 64, dispatch.HOPPER)
    assert not plan.forward.gluon and "CS336_FLASH_GLUON=0" in plan.forward.reason


def test_plan_use_gluon_forces_every_pass_or_refuses():
    plan = dispatch.plan(BF16, 32, dispatch.HOPPER, use_gluon=True)
    assert plan.forward.gluon and "use_gluon=True" in plan.forward.reason
    # the Gluon dQ pass runs first and computes D
    assert plan.dq.gluon and plan.delta.gluon
    assert [p.name for p in plan.backward] == ["backward_dq", "backward_dkdv"]
    with pytest.raises(ValueError, match="sm_80"):
        dispatch.plan(BF16, 64, dispatch.Target("cuda", (8, 0)), use_gluon=True)
    with pytest.raises(ValueError, match="fuse_dq"):
        dispatch.plan(BF16, 64, dispatch.HOPPER, use_gluon=True, fuse_dq=True)


def test_plan_routing_table_names_every_pass():
    rows = dispatch.routing_table(dispatch.HOPPER)
    assert rows and all(r["reason"] and r["kernel"] for r in rows)
    gluon = {(r["dtype"], r["head_dim"], r["pass"]) for r in rows if r["backend"] == "gluon"}
    assert ("bf16", 64, "forward") in gluon and ("fp32", 64, "forward") not in gluon


@pytest.mark.skipif(not INTERPRET, reason="the interpreter's plan (CPU tensors)")
def test_chosen_configs_follow_the_plan():
    """The autograd Function runs the passes of the plan, and chosen_configs() reports their
    tiles with the plan's reasons."""
    q, k, v, do = _inputs((1, 40, 40, 16), F32, "cpu")
    q.requires_grad_()
    fat.FlashAttentionTriton.apply(q, k, v, True).backward(do)
    plans = fat.last_plans()
    assert plans["forward"] == dispatch.plan(F32, 16, dispatch.INTERPRETER)
    chosen = fat.chosen_configs()
    assert set(chosen) == {"forward", "backward_dkdv", "backward_dq"}
    for p in (plans["forward"].forward, plans["backward"].dkdv, plans["backward"].dq):
        assert (chosen[p.name]["BLOCK_Q"], chosen[p.name]["BLOCK_K"]) == p.tiles
        assert chosen[p.name]["reason"] == p.reason and "interpreter" in p.reason


class _FakeGluon:
    """Stands in for the Gluon kernels' host side on CPU: records what the launchers ask for."""

    calls: list = []

    @classmethod
    def forward_into(cls, q, k, v, o, lse, is_causal, config):
        cls.calls.append(("forward", config))
        o.zero_(), lse.zero_()

    @classmethod
    def backward_dkdv_into(cls, q, k, v, do, lse, delta, dk, dv, is_causal, config, acc):
        cls.calls.append(("backward_dkdv", config))
        for x in (acc, dk, dv):
            if x is not None:
                x.zero_()

    @classmethod
    def backward_dq_into(cls, q, k, v, do, lse, delta, dq, is_causal, config, o):
        cls.calls.append(("backward_dq", config))
        dq.zero_()


@pytest.mark.skipif(not INTERPRET, reason="the launchers on CPU tensors")
def test_triton_function_follows_a_hopper_plan(monkeypatch):
    """With the target taken for a Hopper GPU, the autograd Function launches the Gluon passes of
    the plan with the plan's tiles (d = 64: the forward, then the dK/dV pass computing dQ), and
    chosen_configs() says so."""
    monkeypatch.setattr(dispatch, "target_of", lambda device: dispatch.HOPPER)
    monkeypatch.setattr(fat, "_gluon", lambda: _FakeGluon)
    monkeypatch.setattr(_FakeGluon, "calls", [])
    q, k, v, do = _inputs((1, 32, 32, 64), F16, "cpu", heads=2)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    fat.FlashAttentionTriton.apply(*leaves, True).backward(do)
    assert _FakeGluon.calls == [
        ("forward", hopper_configs.FORWARD_CONFIGS[64]),
        ("backward_dkdv", hopper_configs.DKDV_CONFIGS[64]),
    ]
    chosen = fat.chosen_configs()
    assert chosen["forward"]["kernel"] == "gluon" and chosen["forward"]["warp_specialized"]
    assert chosen["backward_dkdv"]["kernel"] == "gluon" and "backward_dq" not in chosen


@pytest.mark.skipif(not INTERPRET, reason="the launchers on CPU tensors")
@pytest.mark.parametrize("d", [16, 32])
def test_two_pass_gluon_backward_launches_each_pass_with_its_own_tiles(monkeypatch, d):
    """Where the dK/dV pass does not compute dQ (d = 16, 32 with use_gluon), the dQ pass gets
    the dQ tiles and the dK/dV pass its own: a closure reading the pass late once handed the dQ
    kernel the dK/dV tiles (six Hopper tests failed on an H100)."""
    monkeypatch.setattr(dispatch, "target_of", lambda device: dispatch.HOPPER)
    monkeypatch.setattr(fat, "_gluon", lambda: _FakeGluon)
    monkeypatch.setattr(_FakeGluon, "calls", [])
    q, k, v, do = _inputs((1, 32, 32, d), F16, "cpu", heads=2)
    o, lse = fat.flash_forward_triton(q, k, v, True, use_gluon=True)
    fat.flash_backward_triton(q, k, v, o, do, lse, True, use_gluon=True)
    calls = dict(_FakeGluon.calls)
    assert calls["backward_dq"] == hopper_configs.config_for("backward_dq", d)
    assert calls["backward_dkdv"] == hopper_configs.config_for("backward_dkdv", d)
    assert calls["backward_dq"][4]["WS"]


@pytest.mark.skipif(not INTERPRET, reason="the launchers on CPU tensors")
def test_hopper_plan_with_broken_gluon_kernels_raises(monkeypatch):
    """Where the plan routes a pass to Gluon, the launcher imports the Gluon kernels plainly:
    one that fails to import is an error, never a silent fallback to the Triton-language
    kernels."""
    monkeypatch.setattr(dispatch, "target_of", lambda device: dispatch.HOPPER)
    monkeypatch.setitem(sys.modules, "cs336_systems.kernels.hopper.launch", None)
    q, k, v, _ = _inputs((1, 32, 32, 64), F16, "cpu", heads=2)
    assert dispatch.plan(F16, 64, dispatch.HOPPER, tensors=(q, k, v)).forward.gluon
    with pytest.raises(ImportError, match="hopper.launch"):
        fat.flash_forward_triton(q, k, v, True)
