"""Where the leaderboard configuration's time goes, and what candidate settings change it: the
flash stage's leaderboard measurement (torch.compile(FlashAttentionTriton.apply), forward and
backward of o.sum(), do_bench) for ours under each variant and for SDPA cuDNN, in one process,
plus a torch.profiler breakdown of one step (kernel times and the GPU idle time around them).

    python3 benchmarks/flash_leaderboard_probe.py --out $OUT [--variants default dq_pinned ...]
    python3 benchmarks/flash_leaderboard_probe.py --out $OUT --timeline   # do_bench's loop, profiled
    ncu --profile-from-start off ... python3 benchmarks/flash_leaderboard_probe.py --out $OUT --one-step

``--timeline`` runs do_bench's own loop (gradients to None, L2 cleared, events around each step,
no synchronization between steps) under torch.profiler for ours and SDPA cuDNN, and splits each
step's event time into the wait for its first kernel, kernel time and the gaps between kernels.
``--one-step`` runs one warmed-up step of each inside cudaProfilerStart/Stop, for ncu. Both
modes run ours under each of ``--variants`` (in order), then SDPA cuDNN.

Variants patch the routing tables of this process only (nothing is written back):
``dq=BQ,BK,W,S`` pins the Triton dQ pass's tile, ``dkdv=<config>`` / ``fwd=<config>`` set the
Gluon tiles at d=64 (the tables of kernels/hopper/configs.py, e.g. ``dkdv=64,64,4,3,{'A_IN_REGS':True}``),
``gdq=<config>`` the Gluon dQ pass's (``gdq=none``: the Triton-language dQ pass);
several, joined by ``+``, make one variant. Rows go to OUT/leaderboard_probe.jsonl.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def emit(out: Path, row: dict) -> None:
    print(json.dumps(row), flush=True)
    with open(out / "leaderboard_probe.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


ORIGINAL: dict = {}


def apply_variant(text: str) -> None:
    """Set the routing tables of this process for one variant (see the module docstring)."""
    import copy

    from cs336_systems.kernels.hopper import configs as fh
    from cs336_systems.kernels.triton import configs as tl_configs
    from cs336_systems.kernels.triton import launch as triton_launch

    original = ORIGINAL.setdefault(
        "tables",
        copy.deepcopy(
            (tl_configs.TILE_CONFIGS, fh.DKDV_CONFIGS, fh.FORWARD_CONFIGS, fh.DQ_CONFIGS)
        ),
    )
    tiles, dkdv, fwd, gdq = copy.deepcopy(original)
    tl_configs.TILE_CONFIGS.update(tiles)
    fh.DKDV_CONFIGS.clear()
    fh.DKDV_CONFIGS.update(dkdv)
    fh.FORWARD_CONFIGS.clear()
    fh.FORWARD_CONFIGS.update(fwd)
    fh.DQ_CONFIGS.clear()
    fh.DQ_CONFIGS.update(gdq)
    for tuned in triton_launch._TUNED.values():  # choices made under another variant's tables
        tuned.cache.clear()
    for part in text.split("+"):
        if part == "default":
            continue
        key, _, value = part.partition("=")
        if part == "gdq=none":  # the Triton-language dQ pass
            fh.DQ_CONFIGS.pop(64, None)
            continue
        cfg = tuple(ast.literal_eval(f"({value},)"))
        if key == "dq":
            tl_configs.TILE_CONFIGS["backward_dq"]["16bit"] = [cfg]
        elif key == "dkdv":
            fh.DKDV_CONFIGS[64] = cfg
        elif key == "gdq":
            fh.DQ_CONFIGS[64] = cfg
        elif key == "fwd":
            fh.FORWARD_CONFIGS[64] = cfg
        else:
            raise ValueError(f"unknown variant part {part!r}")


def _kernels_in_order(prof) -> list:
    """The CUDA activity of a torch.profiler run, by start time."""
    return sorted(
        (e for e in prof.events() if e.device_type.name == "CUDA"),
        key=lambda e: e.time_range.start,
    )


def profile_step(step, steps: int = 5) -> dict:
    """Kernel times per step and the part of each step's span when no kernel ran."""
    import torch

    step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
            torch.cuda.synchronize()
    events = _kernels_in_order(prof)
    kernels: dict[str, float] = {}
    for e in events:
        kernels[e.name[:50]] = kernels.get(e.name[:50], 0.0) + e.time_range.elapsed_us() / steps
    busy = sum(kernels.values())
    span = (events[-1].time_range.end - events[0].time_range.start) / steps if events else 0.0
    return {
        "kernels_us": {k: round(v, 1) for k, v in kernels.items()},
        "busy_us": round(busy, 1),
        "span_us_per_step": round(span, 1),
    }


def timeline(step, grads, reps: int = 40) -> dict:
    """do_bench's measurement loop under torch.profiler (CUDA activity only): per step, the event
    time, the lead (start event to the first kernel), the kernel time, the gaps between kernels,
    and each kernel's median duration. A tiny marker kernel after each L2 clear splits the steps."""
    import statistics

    import torch
    from triton import runtime

    cache = runtime.driver.active.get_empty_cache_for_benchmark()
    marker = torch.zeros(4, dtype=torch.int32, device="cuda")
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for i in range(reps):
            for x in grads:
                x.grad = None
            runtime.driver.active.clear_cache(cache)
            marker.bitwise_not_()
            starts[i].record()
            step()
            ends[i].record()
        torch.cuda.synchronize()
    events = _kernels_in_order(prof)
    marks = [j for j, e in enumerate(events) if "bitwise_not" in e.name]
    steps = []
    for a, b in zip(marks, marks[1:] + [len(events) + 1]):
        steps.append(events[a + 1 : b - 1])  # the kernel before the next marker is its L2 clear
    per_kernel: dict[str, list[float]] = {}
    leads, busys, gaps, spans = [], [], [], []
    for a, kernels in zip(marks, steps):
        if not kernels:
            continue
        lead = kernels[0].time_range.start - events[a].time_range.end
        busy = sum(e.time_range.elapsed_us() for e in kernels)
        span = kernels[-1].time_range.end - kernels[0].time_range.start
        leads.append(lead)
        busys.append(busy)
        spans.append(span)
        gaps.append(span - busy)
        for e in kernels:
            per_kernel.setdefault(e.name[:60], []).append(e.time_range.elapsed_us())
    med = statistics.median
    return {
        "event_ms_median": round(med(s.elapsed_time(e) for s, e in zip(starts, ends)), 4),
        "lead_us_median": round(med(leads), 1),
        "busy_us_median": round(med(busys), 1),
        "gap_us_median": round(med(gaps), 1),
        "span_us_median": round(med(spans), 1),
        "kernels_us_median": {k: round(med(v), 1) for k, v in per_kernel.items()},
    }


def main() -> None:
    import torch

    from cs336_systems.stages.flash import measure as fb

    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--variants", nargs="*", default=["default"])
    p.add_argument("--rep-ms", type=float, default=2000)
    p.add_argument("--sdpa", action="store_true", help="also time SDPA cuDNN and flash")
    p.add_argument("--timeline", action="store_true", help="profile do_bench's loop (see above)")
    p.add_argument("--one-step", action="store_true", help="one step of each for ncu (see above)")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    b, h, n, d = 1, 16, 16384, 64
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn((b, h, n, d), generator=g, device="cuda", dtype=torch.bfloat16)
        for _ in range(3)
    )
    if args.timeline or args.one_step:
        # ours under each variant, then SDPA cuDNN
        for impl, variant in [("flash_triton", v) for v in args.variants] + [("sdpa_cudnn", "")]:
            if variant:
                apply_variant(variant)
                torch._dynamo.reset()
            step, leaves = fb.leaderboard_step(
                impl, fb._sdpa(impl) if impl != "flash_triton" else None, q, k, v
            )
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            if args.one_step:
                torch.cuda.profiler.start()
                for x in leaves:
                    x.grad = None
                step()
                torch.cuda.synchronize()
                torch.cuda.profiler.stop()
            else:
                row = {"impl": impl, "variant": variant, "mode": "timeline"}
                emit(out, {**row, **timeline(step, leaves)})
        return
    timer = fb.Timer(torch.device("cuda"), 500, args.rep_ms, 0, 0)
    if args.sdpa:
        for name in ("sdpa_cudnn", "sdpa_flash"):
            row = fb.leaderboard_time(name, fb._sdpa(name), q, k, v, timer)
            emit(out, {"impl": name, **row})
    for variant in args.variants:
        row = {"impl": "flash_triton", "variant": variant}
        try:
            apply_variant(variant)
            torch._dynamo.reset()
            row.update(fb.leaderboard_time("flash_triton", None, q, k, v, timer))
            from cs336_systems.kernels import flash_triton as fat

            row["configs"] = {
                name: fb._config_text(cfg) for name, cfg in fat.chosen_configs().items()
            }
            lb_step, leaves = fb.leaderboard_step("flash_triton", None, q, k, v)

            def step(lb_step=lb_step, leaves=leaves):
                for x in leaves:
                    x.grad = None
                lb_step()

            row.update(profile_step(step))
        except Exception as exc:
            row["status"] = f"error: {type(exc).__name__}: {str(exc)[:300]}"
        emit(out, row)


if __name__ == "__main__":
    main()
