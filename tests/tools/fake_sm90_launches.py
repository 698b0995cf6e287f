"""Child process of the kernels' launch-path test (test_flash_programs.py): on the fake sm90 driver (kernels compiled for
an H100, launches recorded, nothing run), each case's forward and backward launches through the
plain path (a plan and the JIT every call) and through kept programs with bound launches (three
calls: the first through the JIT, then replays). Prints one JSON line: per case, whether every
call's launches (kernel, grid, arguments with pointers named by the tensor they point into)
equal the plain path's, and the launch counts.

    TRITON_INTERPRET=0 python tests/tools/fake_sm90_launches.py CASE...   (CASE: dtype:d:causal[:variant])
"""

from __future__ import annotations

import json
import sys

import fake_sm90  # beside this script
import torch

fake_sm90.install()

from cs336_systems.kernels import bound_launch  # noqa: E402
from cs336_systems.kernels import flash_triton as fat  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def inputs(dtype, d: int, variant: str, n: int = 128, heads: int = 2):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, n, d, generator=g).to(dtype) for _ in range(3))
    do = torch.randn(1, heads, n, d, generator=g).to(dtype)
    if variant == "broadcast_do":  # the gradient of o.sum()
        do = torch.ones((), dtype=dtype).expand(1, heads, n, d)
    elif variant == "misaligned":  # Q one element off 16 bytes: no descriptors for it
        q = torch.randn(1 * heads * n * d + 1, generator=g).to(dtype)[1:].view(1, heads, n, d)
    elif variant == "transposed":  # (b, n, h, d) memory seen as (b, h, n, d)
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
    return q, k, v, do


def canonical(launches, named: dict[int, str]):
    """Launches with each pointer replaced by the name of its tensor, or tmpN in order of first
    appearance (the program's own scratch: D, accumulators)."""
    tmp: dict[int, str] = {}

    def name(ptr):
        if ptr in named:
            return named[ptr]
        return tmp.setdefault(ptr, f"tmp{len(tmp)}")

    out = []
    for launch in launches:
        args = []
        for a in launch.args:
            if isinstance(a, tuple) and a and a[0] == "ptr":
                a = ("ptr", name(a[1]), str(a[2]))
            elif isinstance(a, tuple) and a and a[0] == "tma":
                a = ("tma", name(a[1]), *a[2:])
            args.append(repr(a))
        out.append((launch.kernel, list(launch.grid), args))
    return out


def one_call(q, k, v, do, causal):
    fake_sm90.LAUNCHES.clear()
    o, lse = fat.flash_forward_triton(q, k, v, causal)
    dq, dk, dv = fat.flash_backward_triton(q, k, v, o, do, lse, causal)
    tensors = dict(q=q, k=k, v=v, do=do, o=o, lse=lse, dq=dq, dk=dk, dv=dv)
    named = {}
    for key, t in tensors.items():
        named.setdefault(t.data_ptr(), key)
    del tensors, o, lse, dq, dk, dv  # (kept alive above while the launches were read)
    return canonical(fake_sm90.LAUNCHES, named)


def case(spec: str) -> dict:
    dtype, d, causal, *variant = spec.split(":")
    causal = causal == "causal"

    def fresh():  # new tensors each call (same layout): a stale pointer would show
        return inputs(DTYPES[dtype], int(d), variant[0] if variant else "")

    fat.set_fast_path(programs=False, bind=False)
    plain = one_call(*fresh(), causal)
    fat.set_fast_path(programs=True, bind=True)
    before = dict(bound_launch.STATS)
    fast = [one_call(*fresh(), causal) for _ in range(3)]
    # then twice the same tensors: the second call finds every encoded TMA descriptor kept
    # (`bound_launch._Direct`, keyed by address) and must still launch what the plain path does
    same = fresh()
    fast += [one_call(*same, causal) for _ in range(2)]
    stats = {key: bound_launch.STATS[key] - before[key] for key in before}
    mismatch = [i for i, calls in enumerate(fast) if calls != plain]
    return {
        "case": spec,
        "launches": len(plain),
        "kernels": [launch[0] for launch in plain],
        "equal": not mismatch,
        "mismatch_calls": mismatch,
        "first_diff": next(
            ([p, f] for p, f in zip(plain, fast[mismatch[0]], strict=False) if p != f),
            None,
        )
        if mismatch
        else None,
        "stats": stats,
        "unbound": dict(bound_launch.UNBOUND),
        "programs": len(fat._PROGRAMS),
        "direct": _direct_launches(),
    }


def _direct_launches() -> dict[str, bool]:
    """Per bound launch of the kept programs: whether it launches through the C launcher
    directly (`bound_launch._Direct`)."""
    out = {}
    for program in fat._PROGRAMS.values():
        steps = [getattr(program, "step", None), *getattr(program, "steps", ())]
        for sub in getattr(program, "backward_programs", {}).values():
            steps += sub.steps
        for step in steps:
            if step is not None and step.bound is not None:
                out[f"{step.name}/{step.bound.name}"] = step.bound.direct is not None
    return out


if __name__ == "__main__":
    print(json.dumps([case(spec) for spec in sys.argv[1:]]))
