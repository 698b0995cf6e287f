"""The fast path of our FlashAttention calls (`kernels.flash_triton`'s kept programs and
`kernels.bound_launch`): a program is kept per call key and its launches replayed. Checked here
on CPU: under Triton's interpreter, programs give the same results as the plain path (a plan and
the JIT every call) and a change of shape, strides, dtype, alignment, causality, options or
process state never reuses a wrong program; on the fake sm90 driver (kernels compiled for an
H100, launches recorded: tests/fake_sm90_launches.py in a child process), the bound launches hand
the kernels exactly the grids and arguments of the plain path, with each call's own tensors.
The GPU tests (marked `gpu`) run both paths natively."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# plain imports: a kernel module that fails to import fails this file, never skips it
from cs336_systems.kernels import bound_launch
from cs336_systems.kernels import flash_triton as fat
from cs336_systems.kernels.triton.common import INTERPRET

# the repository (these files also run alone, in the kernel_tests stage)
ROOT = Path(__file__).resolve().parents[3]

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA and not INTERPRET else "cpu"


@pytest.fixture(autouse=True)
def _fast_path_restored():
    saved = dict(fat.FAST)
    fat.clear_programs()
    yield
    fat.set_fast_path(**saved)


def _qkv(n=32, d=16, dtype=F32, heads=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, heads, n, d, generator=g).to(dtype=dtype, device=DEVICE) for _ in "qkvo"]


def _run(q, k, v, do, causal=True, **options):
    o, lse = fat.flash_forward_triton(q, k, v, causal, **options)
    return (o, lse, *fat.flash_backward_triton(q, k, v, o, do, lse, causal, **options))


def _plain(q, k, v, do, causal=True, **options):
    fat.set_fast_path(programs=False)
    try:
        return _run(q, k, v, do, causal, **options)
    finally:
        fat.set_fast_path(programs=True)


def _same(a, b):
    return all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.skipif(DEVICE == "cpu" and not INTERPRET, reason="CPU tensors need TRITON_INTERPRET=1")
@pytest.mark.parametrize("dtype", [F32, F16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_program_gives_the_plain_results_and_is_kept(dtype, causal):
    """A repeated call reuses its program (one per pass) and returns what the plain path
    returns, bit for bit."""
    q, k, v, do = _qkv(dtype=dtype)
    fat.set_fast_path(programs=True)
    first = _run(q, k, v, do, causal)
    programs = dict(fat._PROGRAMS)
    assert len(programs) == 2  # the forward's and the backward's
    again = _run(q, k, v, do, causal)
    assert fat._PROGRAMS == programs  # the same program objects, no new ones
    assert _same(first, again) and _same(first, _plain(q, k, v, do, causal))


def _variants():
    """Calls that differ from the base call (n 32, d 16, fp32, causal, contiguous) in one
    thing the plan or the JIT specializes on."""

    def misaligned(x):
        flat = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)[1:]
        return flat.view(x.shape).copy_(x)

    def transposed(x):
        return x.transpose(1, 2).contiguous().transpose(1, 2)

    return {
        "seq_len": lambda t: (_qkv(n=48), {}),
        "head_dim": lambda t: (_qkv(d=32), {}),
        "heads": lambda t: (_qkv(heads=3), {}),
        "dtype": lambda t: (_qkv(dtype=F16), {}),
        "strides": lambda t: ([transposed(t[0]), *t[1:]], {}),
        "alignment": lambda t: ([misaligned(t[0]), *t[1:]], {}),
        "dO_broadcast": lambda t: ([*t[:3], torch.ones((), device=DEVICE).expand(t[3].shape)], {}),
        "three_d": lambda t: ([x[:, 0] for x in t], {}),
        "full": lambda t: (t, {"causal": False}),
        "blocks": lambda t: (t, {"blocks": (16, 16)}),
    }


@pytest.mark.skipif(DEVICE == "cpu" and not INTERPRET, reason="CPU tensors need TRITON_INTERPRET=1")
@pytest.mark.parametrize("variant", list(_variants()))
def test_a_changed_call_never_reuses_a_program(variant):
    """After the base call's programs are kept, a call differing in one specialized thing gets
    results equal to the plain path's for that call (a reused program would launch with the
    base call's shapes, strides or switches) and new programs (none where options are given:
    those calls are planned each time)."""
    base = _qkv()
    fat.set_fast_path(programs=True)
    _run(*base)
    kept = set(fat._PROGRAMS)
    tensors, options = _variants()[variant](base)
    fast = _run(*tensors, **options)
    new = set(fat._PROGRAMS) - kept
    assert set(fat._PROGRAMS) >= kept
    # options: planned each call; a new dO layout: only the backward's program is new
    assert len(new) == {"blocks": 0, "dO_broadcast": 1}.get(variant, 2), variant
    assert _same(fast, _plain(*tensors, **options))  # (the plain path forgets every program)


@pytest.mark.skipif(DEVICE == "cpu" and not INTERPRET, reason="CPU tensors need TRITON_INTERPRET=1")
def test_process_state_is_part_of_the_key(monkeypatch):
    """fp32 matmul precision and the environment switches a plan reads make new programs."""
    base = _qkv()
    fat.set_fast_path(programs=True)
    _run(*base)
    n = len(fat._PROGRAMS)
    monkeypatch.setenv("CS336_FLASH_DESC", "0")
    _run(*base)
    assert len(fat._PROGRAMS) == n + 2
    saved = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest" if saved != "highest" else "high")
        fast = _run(*base)
        assert len(fat._PROGRAMS) == n + 4
        assert _same(fast, _plain(*base))
    finally:
        torch.set_float32_matmul_precision(saved)


def _autograd(q, k, v, do, causal=True):
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    o = fat.FlashAttentionTriton.apply(*leaves, causal)
    o.backward(do)
    return (o.detach(), *(x.grad for x in leaves))


@pytest.mark.skipif(DEVICE == "cpu" and not INTERPRET, reason="CPU tensors need TRITON_INTERPRET=1")
def test_an_autograd_backward_uses_its_forward_programs():
    """Through FlashAttentionTriton, the backward's program is kept under the forward's (found
    by dO's layout; the process state is the forward's): repeated calls reuse it, a new dO
    layout gets a new one, and results equal the plain path's; a backward after
    clear_programs() takes the general path (no program added under the stale forward)."""
    q, k, v, do = _qkv()
    fat.set_fast_path(programs=True)
    first = _autograd(q, k, v, do)
    assert len(fat._PROGRAMS) == 1  # the forward's; the backward's is under it
    (forward,) = fat._PROGRAMS.values()
    assert len(forward.backward_programs) == 1
    backward = next(iter(forward.backward_programs.values()))
    again = _autograd(q, k, v, do)
    assert list(fat._PROGRAMS.values()) == [forward]
    assert list(forward.backward_programs.values()) == [backward]
    ones = torch.ones((), device=DEVICE).expand(do.shape)  # stride-0 dO: another layout
    broadcast = _autograd(q, k, v, ones)
    assert len(forward.backward_programs) == 2
    assert _same(first, again)
    fat.set_fast_path(programs=False)
    assert _same(first, _autograd(q, k, v, do))
    assert _same(broadcast, _autograd(q, k, v, ones))
    fat.set_fast_path(programs=True)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    o = fat.FlashAttentionTriton.apply(*leaves, True)
    (stale,) = fat._PROGRAMS.values()
    fat.clear_programs()
    o.backward(do)
    assert stale.backward_programs == {}
    assert _same(first, (o.detach(), *(x.grad for x in leaves)))


@pytest.mark.skipif(DEVICE == "cpu" and not INTERPRET, reason="CPU tensors need TRITON_INTERPRET=1")
def test_chosen_configs_name_the_last_calls_passes():
    """A kept program reports its choices once, yet chosen_configs() and last_plans() always
    name what the last forward and backward ran: a call with its own tiles in between, then
    the kept program again, and a fused backward (no dQ pass) then the kept two-pass one."""
    q, k, v, do = _qkv()
    fat.set_fast_path(programs=True)
    _run(q, k, v, do)
    kept, plans = fat.chosen_configs(), fat.last_plans()
    _run(q, k, v, do, blocks=(16, 16))
    tiles = fat.chosen_configs()
    assert tiles != kept and tiles["forward"]["BLOCK_Q"] == 16
    _run(q, k, v, do)
    assert fat.chosen_configs() == kept and fat.last_plans() == plans
    o, lse = fat.flash_forward_triton(q, k, v, True)
    fat.flash_backward_triton(q, k, v, o, do, lse, True, fuse_dq=True)
    assert "backward_fused" in fat.chosen_configs() and "backward_dq" not in fat.chosen_configs()
    _run(q, k, v, do)
    assert fat.chosen_configs() == kept


def _fused_grads(q, k, v, do):
    o, lse = fat.flash_forward_triton(q, k, v, True)
    return fat.flash_backward_triton(q, k, v, o, do, lse, True, fuse_dq=True)


@pytest.mark.skipif(DEVICE == "cpu" and not INTERPRET, reason="CPU tensors need TRITON_INTERPRET=1")
def test_the_fused_pass_shares_one_buffer_for_d_and_dq_and_matches_the_two_passes():
    """The fused backward's D and fp32 dQ accumulator come from one allocation (D after the
    accumulator): its gradients equal the two-pass backward's within fp32 rounding, call after
    call (a stale or overlapping D would show)."""
    q, k, v, do = _qkv(n=40, d=32)
    o, lse = fat.flash_forward_triton(q, k, v, True)
    two = fat.flash_backward_triton(q, k, v, o, do, lse, True)
    for _ in range(2):
        fused = _fused_grads(q, k, v, do)
        for a, b in zip(two, fused, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_the_interpreter_never_binds():
    """Binding needs compiled kernels: in the interpreter (or with CS336_FLASH_BIND=0) every
    launch goes through the JIT."""
    if INTERPRET:
        assert not bound_launch.binding_supported()
    fat.set_fast_path(bind=True)
    assert fat.FAST["bind"] == bound_launch.binding_supported()


CASES = [
    "bf16:64:causal",  # Gluon forward and fused dK/dV+dQ (an accumulator zeroed by the D kernel)
    "bf16:16:causal",  # autotuned Triton-language forward and dQ, Gluon dK/dV
    "bf16:128:full",  # Gluon forward, Gluon dQ (computing D), Gluon dK/dV
    "bf16:32:causal:broadcast_do",  # stride-0 dO: a dense copy for the Triton passes
    "bf16:64:causal:misaligned",  # Q off 16 bytes: no descriptors, Triton-language passes
    "bf16:64:causal:transposed",  # (b, n, h, d) memory
]


@pytest.mark.skipif(HAS_CUDA, reason="the fake sm90 driver stands in for a GPU on CPU hosts")
def test_bound_launches_equal_the_plain_launches():
    """On the fake sm90 driver, each case's plain launches (kernel, grid, every argument, TMA
    descriptors as the launcher encodes them, pointers named by tensor) equal those of five
    calls through a kept program (three with new input tensors each, the first through the JIT;
    then twice the same tensors, where the encoded descriptors are reused), and the replays
    really were bound launches straight through the C launch. Different cases launch
    differently (the comparison can fail)."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    script = ROOT / "tests" / "tools" / "fake_sm90_launches.py"
    done = subprocess.run(
        [sys.executable, str(script), *CASES],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r["case"] for r in results] == CASES
    for r in results:
        assert r["equal"], (r["case"], r["first_diff"])
        assert r["unbound"] == {}, r
        # 5 calls: the first launches through the JIT, the next four replay every launch, each
        # straight through the C launch (the last two with the same tensors: kept descriptors)
        # (no graphs: the fake driver's tensors are not CUDA tensors)
        expect = {"jit": r["launches"], "bound": 4 * r["launches"], "unbound": 0, "graph": 0}
        assert r["stats"] == expect, r
        assert r["direct"] and all(r["direct"].values()), r["direct"]
    kernels = {r["case"]: r["kernels"] for r in results}
    assert kernels["bf16:64:causal"] != kernels["bf16:64:causal:misaligned"]
    assert "_attn_bwd_dq" not in kernels["bf16:64:causal"]  # fused dQ: no dQ pass


def test_a_launch_that_cannot_be_bound_is_counted_and_explained(monkeypatch):
    """A step that should bind and cannot (nothing to bind, or binding raises) still launches
    through the JIT every call, and each such launch counts as unbound with the reason in
    UNBOUND; a step told not to bind counts nothing unbound."""
    monkeypatch.setattr(bound_launch, "STATS", {"jit": 0, "bound": 0, "unbound": 0})
    monkeypatch.setattr(bound_launch, "UNBOUND", {})
    calls = []

    def nothing(t):  # e.g. an autotuned configuration with a pre-hook
        calls.append(t)
        return {"cfg": 1}, None

    def unbindable(t):  # a launch whose JIT function has no binder
        calls.append(t)
        return None, bound_launch.Launched(object(), object(), (1,), (t[0],), {})

    steps = [
        bound_launch.Step("nothing", nothing, bind=True),
        bound_launch.Step("unbindable", unbindable, bind=True),
        bound_launch.Step("off", nothing, bind=False),
    ]
    x = torch.zeros(2)
    for _ in range(3):
        for step in steps:
            step((x,), 0, 0)
    assert len(calls) == 9
    assert bound_launch.STATS == {"jit": 9, "bound": 0, "unbound": 6}
    assert set(bound_launch.UNBOUND) == {"nothing", "unbindable"}
    assert "no launch" in bound_launch.UNBOUND["nothing"]
    assert "AttributeError" in bound_launch.UNBOUND["unbindable"]
    assert steps[0].reported == {"cfg": 1} and steps[2].why is None


@pytest.mark.gpu
@pytest.mark.parametrize("d", [16, 32, 64, 128])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_gpu_bound_calls_match_the_plain_path(d, causal):
    """On the GPU: three calls through kept programs with fresh inputs each (the first through
    the JIT, every launch of the next two bound and replayed, none unbound) give the plain
    path's results: O and L bit for bit, gradients to rounding. The plain results are taken
    first: the plain path forgets every kept program."""
    if not HAS_CUDA:
        pytest.skip("needs a CUDA GPU")

    def inputs(seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        return [torch.randn(1, 4, 512, d, generator=g, device="cuda", dtype=BF16) for _ in "qkvo"]

    plain = [_plain(*inputs(seed), causal) for seed in range(3)]
    fat.set_fast_path(programs=True, bind=True, graphs=False)  # the launches themselves
    assert fat.FAST["bind"], "binding unsupported on this Triton"
    bound_launch.UNBOUND.clear()
    launches = None
    for seed in range(3):
        before = dict(bound_launch.STATS)
        fast = _run(*inputs(seed), causal)
        stats = {k: bound_launch.STATS[k] - before[k] for k in before}
        if seed == 0:
            launches = stats["jit"]
            assert launches >= 3 and stats["bound"] == 0, stats
        else:
            assert stats == {"jit": 0, "bound": launches, "unbound": 0, "graph": 0}, (
                stats,
                bound_launch.UNBOUND,
            )
        assert bound_launch.UNBOUND == {}
        assert _same(fast[:2], plain[seed][:2]), seed
        # gradients to rounding (a fused dQ adds tiles in any order)
        for a, b in zip(fast[2:], plain[seed][2:], strict=True):
            torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_backward_graphs_replay_what_the_launches_compute(d):
    """On the GPU, a backward called again and again as a training loop calls it (each call's
    gradients used, then freed): from the second call at an address set on, the launches are
    captured and replayed as one graph (no launch of their own), giving what the launches give;
    new contents at those addresses are read at each replay."""
    if not HAS_CUDA:
        pytest.skip("needs a CUDA GPU")
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (
        torch.randn(1, 4, 512, d, generator=g, device="cuda", dtype=BF16) for _ in "qkvo"
    )
    tol = 0.0 if d == 128 else 2e-2  # d = 64 adds dQ tiles with atomics, in any order

    def gap(expect) -> float:  # one call's largest error against `expect`; its grads freed
        out = fat.flash_backward_triton(q, k, v, o, do, lse, True)
        return max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(out, expect))

    fat.set_fast_path(programs=True, bind=True, graphs=False)
    o, lse = fat.flash_forward_triton(q, k, v, True)
    launched = [t.clone() for t in fat.flash_backward_triton(q, k, v, o, do, lse, True)]
    doubled = [2 * t for t in launched]  # (allocated here: the loop's addresses stay put)
    fat.set_fast_path(programs=True, bind=True, graphs=True)
    before = dict(bound_launch.STATS)
    gaps = [gap(launched) for _ in range(8)]
    stats = {key: bound_launch.STATS[key] - before[key] for key in before}
    assert stats["graph"] >= 5, stats  # the first call JIT, the second captures, then replays
    assert max(gaps) <= tol, gaps
    do.mul_(2)  # new contents at the same addresses: dQ, dK and dV double exactly
    before = dict(bound_launch.STATS)
    assert gap(doubled) <= tol
    assert bound_launch.STATS["graph"] == before["graph"] + 1
