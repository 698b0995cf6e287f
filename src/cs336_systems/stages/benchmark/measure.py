"""Stage `benchmark`: end-to-end latency of the model (forward, forward+backward, training step),
and within each step its phases (forward, backward, optimizer step: `fwd_ms_*`, `bwd_ms_*`,
`opt_ms_*`, timed between marks on the device, beside the whole step's `step_ms_*`).

    python -m cs336_systems.stages.benchmark run --size small --context-length 128 \
        --attention naive --compile eager,compiled --engines plain --block JSON ... --out X.csv
    python -m cs336_systems.stages.benchmark warmup --size small --block JSON ... --out W.csv

`--block`: the job's part of the stage's preset block as JSON (plan.py: `RUN_KNOBS`,
`WARMUP_KNOBS`, as the rules pass them); a point's job takes its size, context, attention and
what of `compile` and `engines` applies to it (plan.py: `compile_arg`, `engines_arg`).

Each (size, context length, attention) job builds the model once and times every mode x
precision x compile point on it through the harness; a point that runs out of memory or fails
is a row with its status, and one the memory model (core/costs.py: step_memory_bytes) says
cannot fit the device's free memory is a `skipped: ...` row, decided before allocating.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import torch

from cs336_systems.core import costs as flops
from cs336_systems.core import own_model
from cs336_systems.core.device import free_memory_mib, memory_shortfall, pick_device
from cs336_systems.core.harness import (
    peak_memory_mb,
    pipelined_ms,
    release_memory,
    run_point,
    summarize,
    time_marked_steps,
)
from cs336_systems.core.results import provenance, write_csv
from cs336_systems.core.workload import PHASE_SPANS, Workload, model_columns
from cs336_systems.kernels.attention import attention_function
from cs336_systems.model import VOCAB_SIZE, size_spec
from cs336_systems.planning.knobs import add_block_argument, add_run_arguments
from cs336_systems.planning.log import configure, get_logger, point, status_level
from cs336_systems.stages.benchmark.engines import engine_rows
from cs336_systems.stages.benchmark.mfu import model_rates, too_costly
from cs336_systems.stages.benchmark.plan import RUN_KNOBS, WARMUP_KNOBS

MODE_WHAT = {
    "forward": "forward",
    "forward_backward": "forward+backward",
    "train_step": "train step",
}

log = get_logger(__name__)


PHASES = ("fwd", "bwd", "opt")
MiB = 2**20


def model_row(size: str, context_length: int, batch_size: int, edition=None) -> dict:
    """The model's columns; `flops_source`: core/costs.py's `formula` for a course size, an
    own model's FLOPs `counted` from the module or `declared` (core/own_model.py)."""
    return {
        "flops_source": "formula",
        **model_columns(size, edition, context_length=context_length, batch_size=batch_size),
        "context_length": context_length,
        "batch_size": batch_size,
    }


def step_memory_mib(
    size: str,
    context_length: int,
    batch_size: int,
    mode: str,
    precision: str,
    device_type: str,
    edition=None,
) -> float:
    """What the memory model says one step needs (MiB): training state + saved activations."""
    s = size_spec(size, edition)
    need = flops.step_memory_bytes(
        VOCAB_SIZE,
        s["d_model"],
        s["num_layers"],
        s["num_heads"],
        s["d_ff"],
        batch_size,
        context_length,
        mode,
        precision,
        device_type,
    )
    return need["total_bytes"] / MiB


def step_flops(size: str, context_length: int, batch_size: int, mode: str, edition=None) -> float:
    if (own := own_model.spec_for(size)) is not None:
        return own_model.describe(own, context_length, batch_size)["flops"][mode]
    spec = size_spec(size, edition)
    return flops.model_flops(
        VOCAB_SIZE,
        spec["d_model"],
        spec["num_layers"],
        spec["d_ff"],
        batch_size,
        context_length,
        mode,
    )


def measure(
    work: Workload, mode: str, precision: str, compiled: bool, warmup: int, steps: int
) -> dict:
    """Time one point; returns the stats columns (raises on OOM/failure: run_point catches):
    the whole step's (`step_ms_*`, host clock, synchronized) and each phase's (`fwd_ms_*`,
    `bwd_ms_*`, `opt_ms_*`, between the step's marks: CUDA events, or the host clock on a
    CPU); a phase the mode lacks is NaN."""
    step, cleanup = work.step(mode, precision, compiled)
    try:
        if work.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(work.device)
        out = time_marked_steps(
            step, warmup, steps, work.device, PHASE_SPANS[mode], with_warmup=True
        )
        warm, times = out["warmup"], out["step"]
        # the training loop's rate too (no synchronization between steps): a train step only
        extra = (
            {"pipelined_ms": pipelined_ms(step, steps, work.device)} if mode == "train_step" else {}
        )
        phases = {}
        for name in PHASES:
            phases.update(summarize(out.get(name, []), name))
        return {
            **summarize(times, "step"),
            **phases,
            "first_step_ms": (warm or times)[0],
            "warmup_times_ms": json.dumps([round(t, 4) for t in warm]),
            "step_times_ms": json.dumps([round(t, 4) for t in times]),
            "peak_memory_mb": peak_memory_mb(work.device),
            **extra,
        }
    finally:
        cleanup()


def grid_points(
    modes: list[str],
    precisions: list[str],
    compiles: list[str],
    compile_modes: list[str] | None = None,
    compile_precisions: list[str] | None = None,
) -> list[tuple[str, str, str]]:
    """(compile, precision, mode) of every point: every eager one, and the compiled ones of the
    modes and precisions that get compiled points (default: all)."""
    compile_modes = compile_modes if compile_modes is not None else modes
    compile_precisions = compile_precisions if compile_precisions is not None else precisions
    return [
        (c, p, m)
        for c in compiles
        for p in precisions
        for m in modes
        if c == "eager" or (m in compile_modes and p in compile_precisions)
    ]


def memory_skips(
    size: str,
    context_length: int,
    batch_size: int,
    modes: list[str],
    precisions: list[str],
    device: torch.device,
    free: float,
    edition=None,
) -> dict[tuple[str, str], tuple[str, float]]:
    """{(mode, precision): (why, MiB needed)} of the points the memory model says cannot fit
    `free` MiB: decided before allocating anything (an own model's memory is not modelled: its
    points run, one that runs out of memory an `oom` row)."""
    skipped = {}
    if own_model.spec_for(size) is not None:
        return skipped
    for prec in precisions:
        for mode in modes:
            need = step_memory_mib(
                size, context_length, batch_size, mode, prec, device.type, edition
            )
            what = f"{size} {MODE_WHAT[mode]} in {prec} (state + saved activations)"
            if why := memory_shortfall(need, device, what, free):
                skipped[mode, prec] = (why, need)
    return skipped


def step_rates(flops_per_step: float, step_ms: float, tokens: int) -> dict:
    """A measured step's FLOPs, TFLOP/s and tokens per second."""
    return {
        "flops_per_step": flops_per_step,
        "tflops": flops.tflops(flops_per_step, step_ms),
        "tokens_per_s": tokens / (step_ms * 1e-3),
    }


def measured_row(
    row: dict, work: Workload, mode: str, precision: str, compiled: bool, warmup: int,
    steps: int, flops_per_step: float, tokens: int, label: str,
) -> dict:  # fmt: skip
    """`row` with one point's measurement: its status and, when ok, its timings and rates
    (logged after `label`, the point's place in the grid)."""
    res = run_point(lambda: measure(work, mode, precision, compiled, warmup, steps))
    row["status"] = res.status
    if res.status == "ok":
        row.update(res.value)
        row.update(step_rates(flops_per_step, row["step_ms_mean"], tokens))
    summary = f" {row['step_ms_mean']:.2f} ms" if res.status == "ok" else ""
    log.log(status_level(res.status), "%s %s%s", label, res.status, summary)
    return row


def run_grid(
    size: str,
    context_length: int,
    modes: list[str],
    precisions: list[str],
    compiles: list[str],
    attention: str,
    batch_size: int,
    warmup: int,
    steps: int,
    device: torch.device,
    base: dict,
    compile_modes: list[str] | None = None,
    compile_precisions: list[str] | None = None,
    compile_mode: str = "default",
    edition=None,
    rates: dict[str, tuple[float, str]] | None = None,
    max_point_s: float | None = None,
) -> list[dict]:
    """Every mode x precision x compile point of one model shape, on one model built once (its
    compiled module shared by the compiled points). A point estimated above `max_point_s` at
    the measured `rates` (derived.too_costly) is a `skipped:` row."""
    rows: list[dict] = []
    fixed = {
        **base,
        **model_row(size, context_length, batch_size, edition),
        "attention": attention,
        "compile_mode": compile_mode,
    }
    points = grid_points(modes, precisions, compiles, compile_modes, compile_precisions)
    # before allocating anything: the points the memory model says cannot fit what is free,
    # and those the measured matmul rates say would take longer than max_point_s
    free = free_memory_mib(device)
    skipped = memory_skips(
        size, context_length, batch_size, modes, precisions, device, free, edition
    )
    step_f = {m: step_flops(size, context_length, batch_size, m, edition) for m in modes}
    costly = {
        (c, p, m): too_costly(step_f[m], warmup + steps, p, rates or {}, max_point_s)
        for c, p, m in points
    }
    built = None  # nothing runs: no model to build
    if not all((m, p) in skipped or costly[(c, p, m)] for c, p, m in points):
        built = run_point(
            lambda: Workload.build(
                size,
                context_length,
                batch_size,
                device,
                attention_function(attention),
                compile_mode=compile_mode,
                edition=edition,
            )
        )
    for n, (comp, prec, mode) in enumerate(points, 1):
        row = {**fixed, "mode": mode, "precision": prec, "compile": comp}
        row.update(warmup_steps=warmup, measure_steps=steps)
        if (mode, prec) in skipped:
            why, need = skipped[mode, prec]
            rows.append({**row, "status": why, "needed_memory_mb": need, "free_memory_mb": free})
            log.log(status_level(why), "%d/%d %s", n, len(points), why)
        elif costly[(comp, prec, mode)]:
            rows.append({**row, "status": costly[(comp, prec, mode)]})
            with point(mode, prec, comp):
                log.info("%d/%d %s", n, len(points), costly[(comp, prec, mode)])
        elif built.status != "ok":
            rows.append({**row, "status": built.status})
        else:
            with point(mode, prec, comp):
                rows.append(measured_row(
                    row, built.value, mode, prec, comp == "compiled", warmup, steps,
                    step_f[mode], batch_size * context_length, f"{n}/{len(points)}",
                ))  # fmt: skip
    built = None
    release_memory()
    return rows


def run_warmup_sweep(
    size: str,
    context_length: int,
    warmups: list[int],
    steps: int,
    mode: str,
    precision: str,
    batch_size: int,
    device: torch.device,
    base: dict,
    edition=None,
) -> list[dict]:
    """The same point measured after each warm-up count of `warmups`, each on a freshly built
    model in this process (`warmup_rows` runs one count per process: a later count in the same
    process would find the libraries warm). `process_id` names the process that measured it."""
    rows = []
    for w in warmups:

        def measure_fresh(w=w):
            work = Workload.build(size, context_length, batch_size, device, edition=edition)
            return measure(work, mode, precision, False, w, steps)

        with point(f"warmup={w}"):
            res = run_point(measure_fresh)
        row = {
            **base,
            **model_row(size, context_length, batch_size, edition),
            "attention": "naive",
            "mode": mode,
            "precision": precision,
            "compile": "eager",
            "warmup_steps": w,
            "measure_steps": steps,
            "process_id": os.getpid(),
            "status": res.status,
        }
        if res.status == "ok":
            row.update(res.value)
        rows.append(row)
        with point(f"warmup={w}"):
            log.log(status_level(res.status), "%s", res.status)
    return rows


def fresh_process_rows(argv: list[str], warmup: int, fixed: dict) -> list[dict]:
    """One warm-up count measured in a process of its own: this CLI again (`argv`: the job's
    own arguments) with `--only-warmup`, its rows read back; a process that fails is a row with
    its status and the end of its output."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.csv"
        cmd = [sys.executable, "-m", "cs336_systems.stages.benchmark", *_without_out(argv)]
        cmd += ["--out", str(out), "--only-warmup", str(warmup)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        sys.stderr.write(done.stderr)
        if done.returncode == 0 and out.exists():
            return pd.read_csv(out).to_dict("records")
    tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-1:])[:300]
    return [{**fixed, "warmup_steps": warmup, "status": f"error: exit {done.returncode}: {tail}"}]


def _without_out(argv: list[str]) -> list[str]:
    """`argv` without its `--out` (and `--only-warmup`) and their values."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--out", "--only-warmup"):
            skip = True
            continue
        if not a.startswith(("--out=", "--only-warmup=")):
            out.append(a)
    return out


def _csv_list(text: str) -> list[str]:
    """A job-level argument's list (`--compile`, `--engines`: "a,b")."""
    return [x for x in text.split(",") if x]


# what a block that leaves a knob out gets (the knobs that may be left out)
COMPILE_MODE = "default"
# not a knob: the device (CUDA when present)
DEVICE = "auto"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The run's own arguments (the job's size, context, attention, compile list and engines,
    where its rows go and what they say they come from) and the job's part of the stage's
    knobs as one value (`--block`)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, knobs in (("run", RUN_KNOBS), ("warmup", WARMUP_KNOBS)):
        p = sub.add_parser(name)
        p.add_argument("--size", required=True, help="the job's model size")
        add_run_arguments(p)
        add_block_argument(p, knobs)
    sub.choices["warmup"].add_argument(
        "--only-warmup",
        type=int,
        default=None,
        help="measure this one warm-up count (the process the sweep starts per count)",
    )
    run = sub.choices["run"]
    run.add_argument("--context-length", type=int, required=True, help="the job's context")
    run.add_argument("--attention", required=True, help="the job's attention")
    run.add_argument("--compile", required=True, help="the job's compile settings (compile_arg)")
    run.add_argument("--engines", required=True, help="the job's engines (engines_arg)")
    run.add_argument(
        "--ceilings", default="", help="the ceilings CSV: measured matmul rates per precision"
    )
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.out is None:
        ap.error("--out is required")
    return args


def plain_rows(args: argparse.Namespace, device: torch.device, base: dict) -> list[dict]:
    """The job's grid through the plain model (plan.py: `RUN_KNOBS`, `compile_arg`)."""
    k = args.block
    only = k.compile_only
    rows = run_grid(
        args.size,
        args.context_length,
        list(k.modes),
        list(k.precisions),
        _csv_list(args.compile),
        args.attention,
        k.batch_size,
        k.warmup_steps,
        k.measure_steps,
        device,
        base,
        list(only.modes) if only and only.modes else None,
        list(only.precisions) if only and only.precisions else None,
        k.compile_mode or COMPILE_MODE,
        args.edition,
        model_rates(pd.read_csv(args.ceilings)) if args.ceilings else {},
        float(k.max_point_s) if k.max_point_s is not None else None,
    )
    for row in rows:
        row["engine"] = "plain"
    return rows


def engine_flops(size: str, context_length: int, batch_size: int, engine: str, edition=None):
    """FLOPs of one training step through `engine`: the model's, but GPT-2's MLP (2 d d_ff,
    not SwiGLU's 3) for `hf_gpt2`."""
    if engine != "hf_gpt2":
        return step_flops(size, context_length, batch_size, "train_step", edition)
    s = size_spec(size, edition)
    return flops.model_flops(
        VOCAB_SIZE,
        s["d_model"],
        s["num_layers"],
        s["d_ff"] * 2 / 3,
        batch_size,
        context_length,
        "train_step",
    )


def engines_rows(args: argparse.Namespace, device: torch.device, base: dict) -> list[dict]:
    """The job's training step through each engine beside the plain model (`engines_arg`)."""
    k = args.block
    fixed = {
        **base,
        **model_row(args.size, args.context_length, k.batch_size, args.edition),
        "attention": "engine",
    }
    rows = engine_rows(
        _csv_list(args.engines),
        args.size,
        args.context_length,
        list(k.precisions),
        _csv_list(args.compile),
        k.batch_size,
        k.warmup_steps,
        k.measure_steps,
        device,
        fixed,
        args.edition,
    )
    for row in rows:
        if row["engine"] != "plain" and row.get("status") == "ok":
            f = engine_flops(args.size, args.context_length, k.batch_size, row["engine"],
                             args.edition)  # fmt: skip
            row.update(step_rates(f, row["step_ms_mean"], k.batch_size * args.context_length))
    return rows


def warmup_rows(args: argparse.Namespace, device: torch.device, base: dict) -> list[dict]:
    """The warm-up sweep's job (plan.py: `WARMUP_KNOBS`): each warm-up count in a fresh process
    (`fresh_process_rows`), so that no count inherits the libraries, kernels and allocator pool
    an earlier count warmed; `--only-warmup` is that process, measuring its one count."""
    k = args.block
    ws = k.warmup_sweep
    counts = list(ws.warmups) if args.only_warmup is None else [args.only_warmup]
    if args.only_warmup is None and ws.fresh_process:
        fixed = {**base, **model_row(args.size, ws.context_length, k.batch_size, args.edition)}
        fixed.update(mode=ws.mode, precision=ws.precision, compile="eager", attention="naive")
        rows = []
        for w in counts:
            with point(f"warmup={w} (a process of its own)"):
                rows += fresh_process_rows(args.argv, w, fixed)
        return rows
    return run_warmup_sweep(
        args.size,
        ws.context_length,
        counts,
        ws.measure_steps,
        ws.mode,
        ws.precision,
        k.batch_size,
        device,
        base,
        args.edition,
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    configure("benchmark")

    device = pick_device(DEVICE)
    base = {**provenance(args.machine, args.preset, args.edition), "device": device.type}
    if args.cmd == "run":
        job = f"{args.size} ctx{args.context_length} {args.attention}"
    else:
        job = f"{args.size} ctx{args.block.warmup_sweep.context_length} warm-up sweep"
    with point(job):
        if args.cmd == "run":
            rows = plain_rows(args, device, base)
            rows += engines_rows(args, device, base)
        else:
            rows = warmup_rows(args, device, base)
    write_csv(rows, args.out)
    log.info("wrote %s: %d rows", args.out, len(rows))


if __name__ == "__main__":
    main()
