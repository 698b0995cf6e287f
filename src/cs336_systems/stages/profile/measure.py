"""Stage `profile`: which kernels a forward pass, a forward+backward and a training step run.

    python -m cs336_systems.stages.profile run --size small --machine M --preset P --block JSON \
        --out S.csv --kernels-out S.kernels.csv --probe-out S.probe.csv --raw-dir raw/ \
        --keep-raw true

`--block`: the job's part of the stage's preset block as JSON (plan.py: `JOB_KNOBS`, every
knob but the sweep's `sizes`, as the rule passes it).

One job per model size. For each context length x mode it times warm-up and measured steps with
the benchmark stage's `Workload` (the same step the harness times), with the model's attention
swapped for `naive_annotated`. Profiler ranges mark each warm-up and measured step (``warmup i``,
``step i``), the point (``point <context>/<mode>``), the phases (zero-length markers
``phase.forward``, ``phase.backward``, ``phase.optimizer``, ``phase.optimizer_end`` set from
module, tensor and optimizer hooks; for Nsight's timeline also NVTX start/end ranges
``forward``, ``backward``, ``optimizer``) and the parts of attention (``attention.qk_matmul`` ...).

Profilers: with `nsys` (found on PATH, through $NSYS or the `nsys` knob) and CUDA, the measurement
runs again as a child of ``nsys profile`` capturing from the first measured step
(``cudaProfilerStart``) and the report is read through its SQLite export. Otherwise, or when
nsys fails, torch.profiler records each point's measured steps (CUDA kernels on a GPU, CPU
operators' self time on a CPU) and a Chrome trace is kept. The ``profiler`` column says which
produced a row and ``profiler_note`` why a fallback happened.

Kernels are attributed to a range by the host time of their launch, across threads, because
backward kernels are launched from the autograd engine's thread. Outputs: one row per point
(status, step times, kernel time per phase) and one row per (point, phase, kernel).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path

import pandas as pd
import torch

from cs336_systems.core import own_model
from cs336_systems.core.device import pick_device
from cs336_systems.core.harness import (
    Stopwatch,
    release_memory,
    run_point,
    summarize,
    synchronize,
    time_steps,
)
from cs336_systems.core.phases import PhaseRanges, phase_hooks
from cs336_systems.core.results import provenance, write_csv
from cs336_systems.core.workload import Workload, model_columns
from cs336_systems.planning.edition import add_edition_argument
from cs336_systems.planning.knobs import add_block_argument, add_run_arguments, block_text
from cs336_systems.planning.log import configure, get_logger, point, status_level
from cs336_systems.profiling import nsys as nsys_tools
from cs336_systems.profiling.annotated_attention import annotate, annotated_naive_attention
from cs336_systems.profiling.attribution import (
    attribute_kernels,
    events_from_torch_profiler,
    kernels_from_nsys_events,
    point_range_name,
    ranges_of_point,
    summarize_kernels,
    summarize_point,
    summary_from_kern_sum,
)
from cs336_systems.profiling.overlap import keep_trace
from cs336_systems.stages.profile import probe
from cs336_systems.stages.profile.plan import JOB_KNOBS, Harness, Probe, grid_contexts, nsys_problem

log = get_logger(__name__)
PROFILER_NSYS = "nsys"
PROFILER_TORCH_CUDA = "torch.profiler-cuda"
PROFILER_TORCH_CPU = "torch.profiler-cpu"


# ---------------------------------------------------------------------------------------------
# Measurement


class _TorchProfilerControl:
    """Start torch.profiler at a point's first measured step, stop and keep its events after."""

    def __init__(self, device: torch.device, trace_dir: Path | None):
        from torch.profiler import ProfilerActivity

        self.activities = [ProfilerActivity.CPU]
        if device.type == "cuda":
            self.activities.append(ProfilerActivity.CUDA)
        self.device_type = device.type
        self.trace_dir = trace_dir
        self.prof = None
        self.results: dict[str, tuple[pd.DataFrame, pd.DataFrame]] = {}

    def start(self) -> None:
        if self.prof is None:
            self.prof = torch.profiler.profile(activities=self.activities, acc_events=True)
            self.prof.__enter__()

    def finish(self, label: str) -> None:
        if self.prof is None:
            return
        prof, self.prof = self.prof, None
        prof.__exit__(None, None, None)
        self.results[label] = events_from_torch_profiler(prof, self.device_type)
        if self.trace_dir is not None:
            self.trace_dir.mkdir(parents=True, exist_ok=True)
            name = label.replace("/", "_").replace(" ", "_")
            # gzip pays for itself on GPU traces; a CPU run's trace is small and gzip is slow
            suffix = ".json.gz" if self.device_type == "cuda" else ".json"
            keep_trace(prof, self.trace_dir / f"{name}.trace{suffix}", None)

    def abort(self) -> None:
        if self.prof is not None:
            try:
                self.prof.__exit__(None, None, None)
            except Exception:  # a failed point's profiler state is not worth a crash
                pass
            self.prof = None


class _CudaProfilerControl:
    """cudaProfilerStart at the first measured step of the first point; stop at the end."""

    def __init__(self):
        self.started = False

    def start(self) -> None:
        if not self.started:
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
            self.started = True

    def finish(self, label: str) -> None:
        pass

    def abort(self) -> None:
        pass

    def stop(self) -> None:
        if self.started:
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()


def measure_point(work, context_length, mode, precision, warmup, steps, control) -> dict:
    """Warm up, then time `steps` annotated steps of one point; the profiler runs from the
    first measured step (control.start) to the end of the point (control.finish)."""
    step, cleanup = work.step(mode, precision, False)
    label = point_range_name(context_length, mode)
    state = {"name": "", "point": None}

    def on_step(phase: str, i: int) -> None:
        if phase == "measure" and i == 0:
            control.start()
            state["point"] = torch.autograd.profiler.record_function(label)
            torch.cuda.nvtx.range_push(label)
            state["point"].__enter__()
        state["name"] = f"{'warmup' if phase == 'warmup' else 'step'} {i}"

    phases = PhaseRanges()

    def annotated_step() -> None:
        with annotate(state["name"]):
            step()
            synchronize(work.device)
            phases.close()

    def close_point() -> None:
        if state["point"] is not None:
            state["point"].__exit__(None, None, None)
            torch.cuda.nvtx.range_pop()
            state["point"] = None

    try:
        with phase_hooks(work.model, phases):
            warm, times = time_steps(annotated_step, warmup, steps, work.device, on_step)
        close_point()
        control.finish(label)
    except BaseException:
        phases.close()
        close_point()
        control.abort()
        raise
    finally:
        cleanup()
    return {
        **summarize(times, "step"),
        "warmup_times_ms": json.dumps([round(t, 4) for t in warm]),
        "step_times_ms": json.dumps([round(t, 4) for t in times]),
    }


def harness_forward(work, precision: str, warmup: int, steps: int) -> dict:
    """The forward timed as the benchmark harness times it (synchronized steps after warm-up),
    before the profiler's capture starts: the time nsys_profile (a) compares the profiler's
    with, at the profiled point itself."""
    step, cleanup = work.step("forward", precision, False)
    try:
        _, times = time_steps(step, warmup, steps, work.device)
    finally:
        cleanup()
    return {
        **summarize(times, "harness"),
        "harness_warmup_steps": warmup,
        "harness_measure_steps": steps,
    }


def run_points(args, control) -> list[dict]:
    """Every (context, mode) point of one size; a failed point is a row with its status."""
    k = args.block
    device = pick_device(args.device)
    harness = harness_of(k)
    rows = []
    for context in k.context_lengths:
        with point(args.size, f"ctx{context}", "build"):
            built = run_point(
                lambda c=context: Workload.build(
                    args.size,
                    c,
                    k.batch_size,
                    device,
                    attention=annotated_naive_attention,
                    edition=args.edition,
                )
            )
        for mode in k.modes:
            row = {"context_length": context, "mode": mode, "point": f"{context}/{mode}"}
            if built.status != "ok":
                rows.append({**row, "status": built.status})
                continue
            timed = {}
            if mode == "forward" and harness.measure_steps > 0:
                with point(args.size, f"ctx{context}", "forward", "harness"):
                    h = run_point(
                        lambda w=built.value: harness_forward(
                            w, k.precision, harness.warmup_steps, harness.measure_steps
                        )
                    )
                    timed = h.value or {"harness_status": h.status}
                    log.log(status_level(h.status), "harness %s %.2f ms", h.status,
                            timed.get("harness_ms_mean", float("nan")))  # fmt: skip
            with point(args.size, f"ctx{context}", mode, k.precision):
                res = run_point(
                    lambda w=built.value, m=mode, c=context: measure_point(
                        w, c, m, k.precision, k.warmup_steps, k.measure_steps, control
                    )
                )
                rows.append({**row, "status": res.status, **timed, **(res.value or {})})
                ms = (res.value or {}).get("step_ms_mean", float("nan"))
                log.log(status_level(res.status), "%s %.2f ms", res.status, ms)
        built = None
        release_memory()
    return rows


# ---------------------------------------------------------------------------------------------
# Profiler choice and the outer driver


def choose_profiler(requested: str, nsys_setting: str | None, cuda: bool) -> tuple[str, str]:
    """(profiler, note): nsys when asked for or `auto` with CUDA and a working nsys."""
    torch_name = PROFILER_TORCH_CUDA if cuda else PROFILER_TORCH_CPU
    if requested == "torch":
        return torch_name, ""
    if not cuda:
        note = "no CUDA device: nsys traces GPU kernels only" if requested == "nsys" else ""
        return torch_name, note
    if nsys_setting and nsys_problem(nsys_setting):
        # the configured nsys, checked before anything runs: not silently another one
        return torch_name, f"nsys {nsys_setting!r} (config `nsys`) is not an executable"
    path = nsys_tools.find_nsys(nsys_setting)
    if path is None:
        return torch_name, "nsys not found (PATH, $NSYS, config `nsys`)"
    return PROFILER_NSYS, path


def _inner_command(args, points_json: Path) -> list[str]:
    """The capture child's command: the same block (its contexts resolved), the same size."""
    k = args.block
    return [
        sys.executable,
        "-m",
        "cs336_systems.stages.profile.measure",
        "capture",
        f"--size={args.size}",
        f"--edition={args.edition}",
        f"--contexts={_cli(k.context_lengths)}",
        "--block",
        block_text(k.as_block()),
        f"--points-out={points_json}",
    ]


class Capture:
    """What a profiler run left: point rows, and either attributed kernels (`att`) or, when
    the events could not be attributed, a whole-capture kernel summary (`summary`)."""

    def __init__(self, rows: list[dict], att: pd.DataFrame | None, summary=None, ranges=None):
        self.rows = rows
        self.att = att
        self.summary = summary
        self.ranges = ranges or {}


def profile_with_nsys(args, nsys_path: str, raw_dir: Path, nsys_log) -> Capture:
    """Run the points as a child of `nsys profile` and attribute the kernels of its report."""
    raw_dir.mkdir(parents=True, exist_ok=True)
    stem = raw_dir / f"{args.size}"
    timeout = nsys_timeout(args.block)
    with tempfile.TemporaryDirectory() as tmp:
        points_json = Path(tmp) / "points.json"
        rep = nsys_tools.run_profile(
            nsys_path, stem, _inner_command(args, points_json), timeout=timeout, log=nsys_log
        )
        rows = json.loads(points_json.read_text())
    stats: dict[str, Path] = {}
    try:
        db = nsys_tools.export_sqlite(nsys_path, rep, timeout=timeout, log=nsys_log)
    except nsys_tools.NsysError as exc:
        db, export_error = None, exc
    try:  # the stats CSVs are for people, and the fallback when the SQLite cannot be read
        stats = nsys_tools.stats_csv(nsys_path, rep, timeout=timeout, log=nsys_log)
    except nsys_tools.NsysError as exc:
        log.warning("nsys stats failed (kept going): %s", exc)
    try:
        if db is None:
            raise export_error
        kernels, ranges = nsys_tools.events_from_sqlite(db)
        att = attribute_kernels(kernels_from_nsys_events(kernels), ranges)
        matched = float(kernels["matched"].mean()) if len(kernels) else float("nan")
    except (nsys_tools.NsysError, sqlite3.Error, pd.errors.DatabaseError, KeyError) as exc:
        if "cuda_gpu_kern_sum" not in stats:
            raise
        reason = f"kernels not split by phase: SQLite events unreadable ({str(exc)[:120]})"
        log.warning("%s; using nsys stats cuda_gpu_kern_sum", reason)
        capture = nsys_tools.read_stats_csv(stats["cuda_gpu_kern_sum"])
        for row in rows:
            row["profiler_note"] = reason
        return Capture(
            rows, None, summary=summary_from_kern_sum(capture, args.block.measure_steps, "all")
        )
    per_point = {row["point"]: ranges_of_point(ranges, row["point"]) for row in rows}
    for row in rows:
        # kernels whose launching API call was not found are placed by their GPU start time,
        # which lags the host: their phase may be late
        row["launch_matched_fraction"] = matched
        if matched < 0.99:
            row["profiler_note"] = (
                f"only {100 * matched:.1f}% of kernels matched their launch call; the rest are "
                "placed by GPU start time"
            )
    return Capture(rows, att, ranges=per_point)


def profile_with_torch(args, raw_dir: Path | None) -> Capture:
    device = pick_device(args.device)
    control = _TorchProfilerControl(device, raw_dir)
    rows = run_points(args, control)
    frames, per_point = [], {}
    for row in rows:
        label = point_range_name(row["context_length"], row["mode"])
        if label in control.results:
            kernels, ranges = control.results[label]
            frames.append(attribute_kernels(kernels, ranges, point=row["point"]))
            per_point[row["point"]] = ranges
    att = (
        pd.concat(frames, ignore_index=True) if frames else attribute_kernels(pd.DataFrame(), None)
    )
    return Capture(rows, att, ranges=per_point)


def drop_raw(raw_dir: Path, size: str) -> None:
    """Remove the large captures of `size` (reports, SQLite, traces); keep the stats CSVs."""
    for pattern in (f"{size}.nsys-rep", f"{size}.sqlite", f"{size}*.qdstrm"):
        for path in raw_dir.glob(pattern):
            path.unlink(missing_ok=True)
    traces = raw_dir / f"{size}_traces"
    if traces.exists():
        shutil.rmtree(traces)


# an own model's attention is its own: no annotated attention's ranges inside it
OWN_ATTENTION = "own (not annotated)"


def attention_of(size: str) -> str:
    """The attention the rows profiled: the annotated naive one swapped into the course's
    model, an own model's (core/own_model.py) as its factory built it."""
    return OWN_ATTENTION if own_model.spec_for(size) is not None else "naive_annotated"


def run(args) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Profile one size with the chosen profiler (falling back to torch.profiler); returns
    (point rows, kernel rows), both with provenance."""
    k = args.block
    cuda = torch.cuda.is_available() and args.device in ("auto", "cuda")
    profiler, detail = choose_profiler(k.profiler, k.nsys or None, cuda)
    note = "" if profiler == PROFILER_NSYS else detail
    raw_dir = Path(args.raw_dir)
    raw_dir.mkdir(parents=True, exist_ok=True)
    capture = None
    if profiler == PROFILER_NSYS:
        with open(raw_dir / f"{args.size}.nsys.log", "w") as nsys_log:
            try:
                capture = profile_with_nsys(args, detail, raw_dir, nsys_log)
            except (nsys_tools.NsysError, OSError, ValueError, KeyError) as exc:
                note = f"nsys failed ({str(exc)[:200]}); fell back to torch.profiler"
                log.warning("%s", note)
                profiler = PROFILER_TORCH_CUDA if cuda else PROFILER_TORCH_CPU
    if capture is None:
        capture = profile_with_torch(args, raw_dir / f"{args.size}_traces")

    base = {
        **provenance(args.machine, args.preset, args.edition),
        **model_columns(args.size, args.edition),
        "precision": k.precision,
        "attention": attention_of(args.size),
        "batch_size": k.batch_size,
        "warmup_steps": k.warmup_steps,
        "measure_steps": k.measure_steps,
        "profiler": profiler,
        "profiler_note": note,
    }
    if capture.att is not None:
        kernels = summarize_kernels(capture.att, k.measure_steps)
    else:
        kernels = capture.summary
    point_rows = []
    for row in capture.rows:
        out = {**base, **row}
        if row.get("status") == "ok" and capture.att is not None:
            sub = capture.att[capture.att["point"] == row["point"]]
            ranges = capture.ranges.get(row["point"], pd.DataFrame())
            out.update(summarize_point(sub, ranges, k.measure_steps))
            if sub.empty:
                out["status"] = "error: profiler recorded no kernels in the measured steps"
        point_rows.append(out)
    points_df = pd.DataFrame(point_rows)
    # a point that failed mid-measurement may have left kernels behind: keep only ok points'
    good = set(points_df.loc[points_df["status"] == "ok", "point"]) | {"all"}
    kernels = kernels[kernels["point"].isin(good)].reset_index(drop=True)
    meta = points_df.set_index("point")[["context_length", "mode"]]
    kernels = kernels.join(meta, on="point")  # point `all` (a whole-capture summary): NaN
    kernels_df = pd.concat(
        [pd.DataFrame([base] * len(kernels)).reset_index(drop=True), kernels], axis=1
    )
    if not args.keep_raw:
        drop_raw(raw_dir, args.size)
    return points_df, kernels_df


def _csv_list(text: str, cast=str) -> list:
    return [cast(x) for x in str(text).split(",") if x]


def _bool(text: str) -> bool:
    if str(text).lower() in ("1", "true", "yes", "on"):
        return True
    if str(text).lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def _cli(values) -> str:
    return ",".join(map(str, values))


# what a block that leaves a knob out gets (the knobs that may be left out)
PROBE = {"start": 256, "max": 16384, "mode": "forward_backward", "above": 128, "count": 3}
NO_HARNESS = {"warmup_steps": 0, "measure_steps": 0}
NSYS_TIMEOUT_S = 600
# not a knob: the device (CUDA when present)
DEVICE = "auto"


def probe_of(k) -> Probe:
    """The block's `probe`, or what a block without one gets."""
    return k.probe if k.probe is not None else Probe(**PROBE)


def harness_of(k) -> Harness:
    """The block's `harness`, or none (no harness forward) where it has none."""
    return k.harness if k.harness is not None else Harness(**NO_HARNESS)


def nsys_timeout(k) -> float:
    """Seconds each nsys command may take: the block's `timeout_s`, else NSYS_TIMEOUT_S."""
    return float(k.timeout_s if k.timeout_s is not None else NSYS_TIMEOUT_S)


def run_probe(args) -> list[int]:
    """`context_lengths: probe`: find the largest context that fits (probe.py), write the
    probe's rows, and return the grid ending there (the start, to record its failure, when
    nothing fits)."""
    k = args.block
    pr = probe_of(k)
    device = pick_device(args.device)
    rows, largest = probe.probe(
        args.size, k.batch_size, k.precision, pr.mode, pr.start, pr.max, device, args.edition
    )
    contexts = grid_contexts(largest, pr.above, pr.count) or [pr.start]
    base = {**provenance(args.machine, args.preset, args.edition), "size": args.size}
    base.update(batch_size=k.batch_size, precision=k.precision, device=device.type)
    grid = _cli(contexts)
    write_csv(pd.DataFrame([{**base, **r, "grid_contexts": grid} for r in rows]), args.probe_out)
    log.info("probe: largest context that fits %s; profiling contexts %s", largest, grid)
    release_memory()
    return contexts


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The run's own arguments (the job's size, where its rows and raw files go, what they say
    they come from) and the stage's knobs as one value (`--block`: its preset block); the
    `capture` child gets the same block and the contexts its parent resolved."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    run_p = sub.add_parser("run", help="profile one model size (the rule's job)")
    run_p.add_argument("--size", required=True, help="the job's model size (one of `sizes`)")
    add_run_arguments(run_p)
    add_block_argument(run_p, JOB_KNOBS)
    run_p.add_argument("--raw-dir", required=True)
    run_p.add_argument("--keep-raw", type=_bool, required=True, help="keep the raw captures")
    run_p.add_argument("--kernels-out", required=True)
    run_p.add_argument("--probe-out", default="", help="the probe's rows (contexts `probe`)")
    cap = sub.add_parser("capture", help="(internal) the measurement nsys profiles")
    cap.add_argument("--size", required=True)
    add_edition_argument(cap)
    cap.add_argument("--contexts", type=lambda s: _csv_list(s, int), required=True)
    add_block_argument(cap, JOB_KNOBS)
    cap.add_argument("--points-out", required=True)
    for p in (run_p, cap):
        p.set_defaults(device=DEVICE)
    args = ap.parse_args(argv)
    if args.cmd == "run" and args.out is None:
        ap.error("--out is required")
    if args.cmd == "capture":  # the contexts its parent resolved
        args.block = dataclasses.replace(args.block, context_lengths=args.contexts)
    if args.cmd == "run" and args.block.context_lengths == "probe" and not args.probe_out:
        ap.error("context_lengths: probe needs --probe-out")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    configure("profile")
    if args.cmd == "capture":
        control = _CudaProfilerControl()
        rows = run_points(args, control)
        control.stop()
        Path(args.points_out).write_text(json.dumps(rows))
        return

    k = args.block
    if k.context_lengths == "probe":  # the block with the contexts the probe found
        args.block = dataclasses.replace(k, context_lengths=run_probe(args))
    elif args.probe_out:  # the grid was given: a row that says so
        row = {**provenance(args.machine, args.preset, args.edition), "size": args.size}
        row.update(status="skipped: context lengths given", grid_contexts=_cli(k.context_lengths))
        write_csv(pd.DataFrame([row]), args.probe_out)
    with Stopwatch() as job:
        points, kernels = run(args)
    write_csv(points, args.out)
    write_csv(kernels, args.kernels_out)
    log.info(
        "wrote %s (%d points, %d not ok) and %s (%d kernel rows) in %.1f s",
        args.out,
        len(points),
        (points["status"] != "ok").sum(),
        args.kernels_out,
        len(kernels),
        job.s,
    )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
