"""What the Hopper (Gluon) kernels compile to, without a GPU: PTX and SASS for sm_90.

Triton ships its own ptxas and cuobjdump, so a CPU machine can build the kernels for sm_90 and
check that they keep the schedule they exist for: the wgmma wait depths in program order,
whether ptxas kept the products asynchronous (it serialises them when it cannot follow the
pipeline), TMA loads and reductions, warp specialization, registers, stack and local memory.

    python tests/tools/inspect_sm90.py [head_dim ...] [--routed] [--dump DIR]

prints one JSON list of `sm90_report`s: the three kernels at each head dim, with the tiles
they run with; with `--routed`, every other pass that `kernels.dispatch` routes to the Gluon
kernels at any head dim; last the one-warpgroup dK/dV pass that fuses dQ at head dims up to 64.
`--dump DIR` also writes each build's PTX and SASS there, to compare two versions of the
source. Run it
without TRITON_INTERPRET: Gluon does not run in Triton's interpreter.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import torch
import triton

from cs336_systems.kernels import dispatch
from cs336_systems.kernels.hopper import configs, launch

KERNELS = ("forward", "backward_dkdv", "backward_dq")


def compile_for_sm90(kernel: str, head_dim: int, is_causal: bool = True, config=None):
    """Compile `kernel` ("forward", "backward_dkdv", "backward_dq") for sm_90 without a GPU
    (Triton's own ptxas), with the arguments its launcher passes: returns the compiled kernel,
    whose `.asm` holds "ttgir", "ptx" and "cubin". Lets a CPU machine check that the kernels
    build with this Triton and keep their schedule."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    # long sequences: the launch order they get (launch.py: TOGETHER_MIN_TILES) is built too
    x = torch.empty(1, 2, 16384, head_dim, dtype=torch.bfloat16)
    stats = torch.empty(1, 2, 16384, dtype=torch.float32)
    if kernel == "forward":
        fn, _, args, constants = launch._forward_call(x, x, x, x, stats, is_causal, config)
    elif kernel == "backward_dq":  # as routed: computing D too
        fn, _, args, constants = launch._dq_call(
            x, x, x, x, stats, stats, x, is_causal, config, o=x
        )
    else:
        fused = configs.fuses_dq(head_dim, config)
        acc = torch.empty(x.shape, dtype=torch.float32) if fused else None
        fn, _, args, constants = launch._dkdv_call(
            x, x, x, x, stats, stats, x, x, is_causal, config, dq=acc
        )
    options = dict(num_warps=constants["num_warps"])
    signature = {name: mangle_type(value) for name, value in args.items()}
    signature.update(dict.fromkeys(constants, "constexpr"))
    source = GluonASTSource(fn, signature, constants)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def _cuobjdump(*args: str) -> str:
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return subprocess.run([str(tool), *args], capture_output=True, text=True, check=True).stdout


def sass_of(compiled) -> tuple[str, str]:
    """(SASS, resource usage) of a compiled kernel's cubin, by cuobjdump."""
    cubin = Path(tempfile.mkdtemp()) / "kernel.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    return _cuobjdump("-sass", str(cubin)), _cuobjdump("--dump-resource-usage", str(cubin))


def report_of(compiled, kernel: str, head_dim: int, fused_dq: bool) -> dict:
    """The schedule and resources of one build (see `sm90_report`)."""
    ptx = compiled.asm["ptx"]
    sass, usage = sass_of(compiled)
    found = {key: int(v) for key, v in re.findall(r"(REG|STACK|LOCAL):(\d+)", usage)}
    waits = [int(n) for n in re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+);", ptx)]
    return {
        "kernel": kernel,
        "head_dim": head_dim,
        "wgmma_waits": waits,
        # ptxas adds a wait after every wgmma where it cannot follow the pipeline (e.g. products
        # in flight across a loop's back edge): the SASS then has more waits than the PTX
        "wgmma_serialized": sass.count("WARPGROUP.DEPBAR") > len(waits),
        "tma_loads": "cp.async.bulk.tensor" in ptx,
        "tma_reductions": "cp.reduce.async.bulk.tensor" in ptx,
        # partitions with their own register budgets: the warp-specialized kernels
        "warp_specialized": "setmaxnreg" in ptx,
        "fused_dq": fused_dq,
        "registers": found.get("REG"),
        "stack_bytes": found.get("STACK"),
        "local_bytes": found.get("LOCAL"),
        "shared_bytes": compiled.metadata.shared,
    }


def sm90_report(kernel: str, head_dim: int, is_causal: bool = True, config=None) -> dict:
    """What `compile_for_sm90` built: the wgmma wait depths in program order, whether ptxas kept
    the products asynchronous, whether the loads are TMA copies, whether it is warp-specialized,
    and registers, stack and local memory per thread (cuobjdump)."""
    compiled = compile_for_sm90(kernel, head_dim, is_causal, config)
    fused = kernel == "backward_dkdv" and configs.fuses_dq(head_dim, config)
    return report_of(compiled, kernel, head_dim, fused)


def without_debug_info(ptx: str) -> str:
    """PTX less its debug information (line records, the labels of inlined scopes, the debug
    sections): what stays equal when kernel source moves between files or into a helper."""
    code = ptx.split("\t.section\t.debug")[0]
    debug = re.compile(r"\s*\.(loc|file)\b|\$L__tmp\d+:$")
    return "\n".join(line for line in code.splitlines() if not debug.match(line))


def builds(head_dims, routed: bool = False) -> list[tuple[str, int, object]]:
    """(kernel, head dim, config; None: the head dim's own) of every build the command line
    reports: each kernel at each head dim with its tiles; with `routed`, then every other pass
    that the dispatch routes to these kernels on sm_90 (bf16, any head dim); last the
    one-warpgroup dK/dV pass fusing dQ (d <= 64)."""
    jobs = [(k, d, None) for d in head_dims for k in KERNELS]
    if routed:
        for d in configs.HEAD_DIMS:
            plan = dispatch.plan(torch.bfloat16, d, dispatch.HOPPER)
            for one in (plan.forward, plan.dkdv, plan.dq):
                if one is not None and one.gluon and (one.name, d, None) not in jobs:
                    jobs.append((one.name, d, None))
    return jobs + [("backward_dkdv", d, configs.FUSED_DQ_CONFIG) for d in head_dims if d <= 64]


def main(argv: list[str] | None = None) -> None:
    import argparse
    import json

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("head_dims", nargs="*", type=int, default=[64])
    ap.add_argument("--dump", type=Path, help="write each build's PTX and SASS into this folder")
    ap.add_argument(
        "--routed", action="store_true", help="also every pass routed to Gluon at any head dim"
    )
    args = ap.parse_args(argv)
    reports = []
    for i, (kernel, d, config) in enumerate(builds(args.head_dims, args.routed)):
        compiled = compile_for_sm90(kernel, d, True, config)
        fused = kernel == "backward_dkdv" and configs.fuses_dq(d, config)
        reports.append(report_of(compiled, kernel, d, fused))
        if args.dump:
            args.dump.mkdir(parents=True, exist_ok=True)
            stem = f"{i}_{kernel}_d{d}"
            (args.dump / f"{stem}.ptx").write_text(without_debug_info(compiled.asm["ptx"]))
            (args.dump / f"{stem}.sass").write_text(sass_of(compiled)[0])
    print(json.dumps(reports))


if __name__ == "__main__":
    main()
