"""Stage `profile`: which kernels a forward pass, a forward+backward and a training step run.

    python -m cs336_systems.profile run --size small --contexts 128,256 --modes forward,train_step \
        --machine M --preset P --out S.csv --kernels-out S.kernels.csv --raw-dir raw/

One job per model size. For each context length x mode it times warm-up and measured steps with
the benchmark stage's `Workload` (the same step the harness times), with the model's attention
swapped for `naive_annotated`. Profiler ranges mark each warm-up and measured step (``warmup i``,
``step i``), the point (``point <context>/<mode>``), the phases (zero-length markers
``phase.forward``, ``phase.backward``, ``phase.optimizer``, ``phase.optimizer_end`` set from
module, tensor and optimizer hooks; for Nsight's timeline also NVTX start/end ranges
``forward``, ``backward``, ``optimizer``) and the parts of attention (``attention.qk_matmul`` ...).

Profilers: with `nsys` (found on PATH, through $NSYS or ``--nsys``) and CUDA, the measurement
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
import json
import os
import re
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from cs336_systems import nsys as nsys_tools
from cs336_systems.annotated_attention import ATTENTION_PARTS, ATTENTION_RANGE, annotate
from cs336_systems.benchmark import Workload, pick_device
from cs336_systems.harness import release_memory, run_point, summarize, synchronize, time_steps
from cs336_systems.kernels import classify_kernel, short_kernel_name
from cs336_systems.model import BATCH_SIZE, size_spec
from cs336_systems.results import provenance, write_csv

MODES = ("forward", "forward_backward", "train_step")
PHASES = ("forward", "backward", "optimizer", "other")
ATTENTION_GROUPS = (ATTENTION_RANGE, *(f"{ATTENTION_RANGE}.{p}" for p in ATTENTION_PARTS))
# every group a kernel can be summarized under: the whole step, its phase, attention (parts)
GROUPS = ("step", *PHASES, *ATTENTION_GROUPS)
_MARKERS = {
    "phase.forward": "forward",
    "phase.backward": "backward",
    "phase.optimizer": "optimizer",
    "phase.optimizer_end": "other",
}
_POINT_RE = re.compile(r"^point (\d+)/(\w+)$")
_STEP_RE = re.compile(r"^step (\d+)$")

PROFILER_NSYS = "nsys"
PROFILER_TORCH_CUDA = "torch.profiler-cuda"
PROFILER_TORCH_CPU = "torch.profiler-cpu"


def point_range_name(context_length: int, mode: str) -> str:
    return f"point {context_length}/{mode}"


def group_column(group: str) -> str:
    """`attention.softmax` -> `attention_softmax` (a column-name-safe group name)."""
    return group.replace(".", "_")


# ---------------------------------------------------------------------------------------------
# Phase markers: hooks on the model and on every optimizer's step


@contextmanager
def phase_hooks(model: torch.nn.Module, mark: Callable[[str], None]) -> Iterator[None]:
    """Call `mark(name)` at the phase boundaries of whatever step runs `model`.

    forward: before the model's forward; backward: when the gradient of the model's output is
    ready (the loss's own backward comes just before it); optimizer / optimizer_end: around any
    `Optimizer.step`. The markers are zero-length ranges, so a step needs no changes.
    """
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    def forward_pre(_module, _args):
        mark("phase.forward")

    def forward_post(_module, _args, output):
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(lambda _grad: mark("phase.backward"))

    handles = [
        model.register_forward_pre_hook(forward_pre),
        model.register_forward_hook(forward_post),
        register_optimizer_step_pre_hook(lambda *_: mark("phase.optimizer")),
        register_optimizer_step_post_hook(lambda *_: mark("phase.optimizer_end")),
    ]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _zero_length_range(name: str) -> None:
    with annotate(name):
        pass


class PhaseRanges:
    """Zero-length markers for the attribution, plus NVTX start/end ranges `forward`,
    `backward`, `optimizer` for people reading the timeline in Nsight Systems (start/end
    ranges, unlike push/pop, may begin on the main thread and end on the autograd thread)."""

    def __init__(self):
        self.open: int | None = None

    def close(self) -> None:
        if self.open is not None:
            torch.cuda.nvtx.range_end(self.open)
            self.open = None

    def __call__(self, name: str) -> None:
        _zero_length_range(name)
        self.close()
        phase = _MARKERS.get(name, "other")
        if phase != "other":
            self.open = torch.cuda.nvtx.range_start(phase)


# ---------------------------------------------------------------------------------------------
# Attribution of kernels to ranges, and the summaries (profiler-independent)


def _assign_intervals(times: np.ndarray, ranges: pd.DataFrame) -> np.ndarray:
    """Index into `ranges` (sorted, non-overlapping start_ns/end_ns) containing each time; -1."""
    if ranges.empty or len(times) == 0:
        return np.full(len(times), -1)
    starts = ranges["start_ns"].to_numpy(dtype=np.int64)
    ends = ranges["end_ns"].to_numpy(dtype=np.int64)
    idx = np.searchsorted(starts, times, side="right") - 1
    ok = (idx >= 0) & (times <= ends[np.clip(idx, 0, None)])
    return np.where(ok, idx, -1)


def _ranges_matching(ranges: pd.DataFrame, pattern: re.Pattern[str]) -> pd.DataFrame:
    names = ranges["name"].astype(str)
    sel = ranges[names.str.match(pattern)].sort_values("start_ns").reset_index(drop=True)
    return sel


def attribute_kernels(
    kernels: pd.DataFrame, ranges: pd.DataFrame, point: str | None = None
) -> pd.DataFrame:
    """Give every kernel launched inside a measured step its point, step, phase and attention part.

    kernels: name, dur_ns, launch_ns (host time of the launch; any time base shared with ranges).
    ranges: name, start_ns, end_ns. `point`: the point label when the capture holds one point
    and no ``point ...`` ranges. Kernels outside every ``step i`` range (warm-up, set-up) are
    dropped. Returns columns name, dur_ns, launch_ns, point, step, phase, attention_part.
    """
    out_cols = ["name", "dur_ns", "launch_ns", "point", "step", "phase", "attention_part"]
    if kernels.empty:
        return pd.DataFrame(columns=out_cols)
    k = kernels.sort_values("launch_ns").reset_index(drop=True)
    t = k["launch_ns"].to_numpy(dtype=np.int64)
    ranges = ranges.astype({"start_ns": "int64", "end_ns": "int64"})

    steps = _ranges_matching(ranges, _STEP_RE)
    si = _assign_intervals(t, steps)
    keep = si >= 0
    k, t, si = k[keep].reset_index(drop=True), t[keep], si[keep]
    k["step"] = steps["name"].str.extract(_STEP_RE, expand=False).astype(int).to_numpy()[si]
    step_start = steps["start_ns"].to_numpy(dtype=np.int64)[si]

    if point is not None:
        k["point"] = point
    else:
        points = _ranges_matching(ranges, _POINT_RE)
        pi = _assign_intervals(t, points)
        labels = points["name"].to_numpy(dtype=object)
        k["point"] = np.where(pi >= 0, labels[np.clip(pi, 0, None)] if len(labels) else "", "")
        k["point"] = k["point"].astype(str).str.removeprefix("point ")

    marks = ranges[ranges["name"].isin(list(_MARKERS))].sort_values("start_ns")
    mt = marks["start_ns"].to_numpy(dtype=np.int64)
    mi = np.searchsorted(mt, t, side="right") - 1
    mlabel = marks["name"].map(_MARKERS).to_numpy(dtype=object)
    in_step = (mi >= 0) & (mt[np.clip(mi, 0, None)] >= step_start) if len(mt) else mi < -1
    k["phase"] = np.where(in_step, mlabel[np.clip(mi, 0, None)] if len(mt) else "", "other")

    parts = _ranges_matching(ranges, re.compile(rf"^{re.escape(ATTENTION_RANGE)}\.\w+$"))
    ai = _assign_intervals(t, parts)
    part_names = parts["name"].to_numpy(dtype=object)
    k["attention_part"] = np.where(
        ai >= 0, part_names[np.clip(ai, 0, None)] if len(parts) else "", ""
    )
    whole = _ranges_matching(ranges, re.compile(rf"^{re.escape(ATTENTION_RANGE)}$"))
    in_attention = _assign_intervals(t, whole) >= 0
    k["in_attention"] = in_attention | (k["attention_part"] != "")
    return k[[*out_cols, "in_attention"]]


def _group_masks(att: pd.DataFrame) -> dict[str, pd.Series]:
    masks = {"step": pd.Series(True, index=att.index)}
    for phase in PHASES:
        masks[phase] = att["phase"] == phase
    masks[ATTENTION_RANGE] = att["in_attention"].astype(bool)
    for part in ATTENTION_GROUPS[1:]:
        masks[part] = att["attention_part"] == part
    return masks


def summarize_kernels(att: pd.DataFrame, steps: int) -> pd.DataFrame:
    """One row per (point, group, kernel): calls, time per step, avg/min/max, share of group."""
    cols = [
        "point",
        "phase",
        "kernel",
        "kernel_short",
        "kernel_class",
        "calls",
        "calls_per_step",
        "total_ms",
        "ms_per_step",
        "avg_ms",
        "min_ms",
        "max_ms",
        "share",
    ]
    if att.empty:
        return pd.DataFrame(columns=cols)
    frames = []
    for group, mask in _group_masks(att).items():
        sub = att[mask]
        if sub.empty:
            continue
        g = (
            sub.groupby(["point", "name"], sort=False)["dur_ns"]
            .agg(["count", "sum", "mean", "min", "max"])
            .reset_index()
        )
        g["phase"] = group
        frames.append(g)
    df = pd.concat(frames, ignore_index=True)
    df = df.rename(columns={"name": "kernel", "count": "calls"})
    df["total_ms"] = df["sum"] / 1e6
    df["avg_ms"], df["min_ms"], df["max_ms"] = df["mean"] / 1e6, df["min"] / 1e6, df["max"] / 1e6
    df["calls_per_step"] = df["calls"] / steps
    df["ms_per_step"] = df["total_ms"] / steps
    df["share"] = df["total_ms"] / df.groupby(["point", "phase"])["total_ms"].transform("sum")
    df["kernel_class"] = df["kernel"].map(classify_kernel)
    df["kernel_short"] = df["kernel"].map(short_kernel_name)
    df = df.sort_values(["point", "phase", "total_ms"], ascending=[True, True, False])
    return df[cols].reset_index(drop=True)


def summarize_point(att: pd.DataFrame, ranges: pd.DataFrame, steps: int) -> dict:
    """Per-step kernel time of every group (mean/std over steps) and host range times."""
    row: dict = {}
    step_ids = sorted(att["step"].unique()) if not att.empty else list(range(steps))
    masks = _group_masks(att) if not att.empty else {}
    for group in GROUPS:
        per_step = []
        for s in step_ids:
            if group in masks:
                sel = att[masks[group] & (att["step"] == s)]
                per_step.append(float(sel["dur_ns"].sum()) / 1e6)
            else:
                per_step.append(0.0)
        stats = summarize(per_step, f"{group_column(group)}_kernel")
        row[f"{group_column(group)}_kernel_ms_mean"] = stats[
            f"{group_column(group)}_kernel_ms_mean"
        ]
        row[f"{group_column(group)}_kernel_ms_std"] = stats[f"{group_column(group)}_kernel_ms_std"]
    if not att.empty:
        row["kernels_per_step"] = len(att) / max(len(step_ids), 1)
        gemm = att["name"].map(classify_kernel) == "gemm"
        total = att["dur_ns"].sum()
        row["gemm_share_step"] = float(att.loc[gemm, "dur_ns"].sum() / total) if total else np.nan
        fwd = att["phase"] == "forward"
        ftotal = att.loc[fwd, "dur_ns"].sum()
        row["gemm_share_forward"] = (
            float(att.loc[fwd & gemm, "dur_ns"].sum() / ftotal) if ftotal else np.nan
        )
    step_ranges = _ranges_matching(ranges, _STEP_RE) if not ranges.empty else ranges
    if not step_ranges.empty:
        dur = (step_ranges["end_ns"] - step_ranges["start_ns"]).astype(float) / 1e6
        row.update(summarize(list(dur), "step_range"))
    return row


# ---------------------------------------------------------------------------------------------
# torch.profiler -> the same (kernels, ranges) frames


def events_from_torch_profiler(prof, device_type: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(kernels, ranges) from a finished torch.profiler run.

    CUDA: every kernel attached to the CPU operator that launched it (launch time = that
    operator's start). CPU: every CPU operator with its self time (its children excluded), so
    the "kernels" of a CPU run are operators. Ranges: the record_function annotations.
    """
    from torch.autograd import DeviceType

    kernels, ranges = [], []
    for evt in prof.events():
        if evt.device_type != DeviceType.CPU:
            continue
        start_ns = int(round(evt.time_range.start * 1e3))
        if evt.is_user_annotation:
            end_ns = int(round(evt.time_range.end * 1e3))
            ranges.append((evt.name, start_ns, end_ns))
            continue
        if device_type == "cuda":
            for kern in evt.kernels:
                kernels.append((kern.name, int(round(kern.duration * 1e3)), start_ns))
        else:
            kernels.append((evt.name, int(round(evt.self_cpu_time_total * 1e3)), start_ns))
    k = pd.DataFrame(kernels, columns=["name", "dur_ns", "launch_ns"])
    r = pd.DataFrame(ranges, columns=["name", "start_ns", "end_ns"])
    return k, r


def kernels_from_nsys_events(kernels: pd.DataFrame) -> pd.DataFrame:
    k = kernels.copy()
    k["dur_ns"] = (k["end_ns"] - k["start_ns"]).astype("int64")
    return k[["name", "dur_ns", "launch_ns"]]


def summary_from_kern_sum(kern_sum: pd.DataFrame, steps: int, point: str = "") -> pd.DataFrame:
    """An `nsys stats cuda_gpu_kern_sum` table as kernel rows of the whole capture (phase
    ``capture``): the degraded summary when the SQLite events cannot be attributed."""
    df = pd.DataFrame(
        {
            "point": point,
            "phase": "capture",
            "kernel": kern_sum["name"],
            "calls": kern_sum["instances"],
            "total_ms": kern_sum["total_ns"] / 1e6,
            "avg_ms": kern_sum["avg_ns"] / 1e6,
            "min_ms": kern_sum["min_ns"] / 1e6,
            "max_ms": kern_sum["max_ns"] / 1e6,
        }
    )
    df["calls_per_step"] = df["calls"] / steps
    df["ms_per_step"] = df["total_ms"] / steps
    df["share"] = df["total_ms"] / df["total_ms"].sum()
    df["kernel_class"] = df["kernel"].map(classify_kernel)
    df["kernel_short"] = df["kernel"].map(short_kernel_name)
    return df


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
            prof.export_chrome_trace(str(self.trace_dir / f"{name}.trace{suffix}"))

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


def run_points(args, control) -> list[dict]:
    """Every (context, mode) point of one size; a failed point is a row with its status."""
    device = pick_device(args.device)
    rows = []
    for context in args.contexts:
        built = run_point(
            lambda c=context: Workload.build(
                args.size, c, args.batch_size, device, attention="naive_annotated"
            )
        )
        for mode in args.modes:
            row = {"context_length": context, "mode": mode, "point": f"{context}/{mode}"}
            if built.status != "ok":
                rows.append({**row, "status": built.status})
                continue
            res = run_point(
                lambda w=built.value, m=mode, c=context: measure_point(
                    w, c, m, args.precision, args.warmup, args.steps, control
                )
            )
            rows.append({**row, "status": res.status, **(res.value or {})})
            ms = (res.value or {}).get("step_ms_mean", float("nan"))
            print(
                f"[profile] {args.size} ctx={context} {mode}: {res.status} {ms:.2f} ms", flush=True
            )
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
    path = nsys_tools.find_nsys(nsys_setting)
    if path is None:
        return torch_name, "nsys not found (PATH, $NSYS, config `nsys`)"
    return PROFILER_NSYS, path


def _inner_command(args, points_json: Path) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "cs336_systems.profile",
        "capture",
        f"--size={args.size}",
        f"--contexts={','.join(map(str, args.contexts))}",
        f"--modes={','.join(args.modes)}",
        f"--precision={args.precision}",
        f"--batch-size={args.batch_size}",
        f"--warmup={args.warmup}",
        f"--steps={args.steps}",
        f"--device={args.device}",
        f"--points-out={points_json}",
    ]
    return cmd


class Capture:
    """What a profiler run left: point rows, and either attributed kernels (`att`) or, when
    the events could not be attributed, a whole-capture kernel summary (`summary`)."""

    def __init__(self, rows: list[dict], att: pd.DataFrame | None, summary=None, ranges=None):
        self.rows = rows
        self.att = att
        self.summary = summary
        self.ranges = ranges or {}


def profile_with_nsys(args, nsys_path: str, raw_dir: Path, log) -> Capture:
    """Run the points as a child of `nsys profile` and attribute the kernels of its report."""
    raw_dir.mkdir(parents=True, exist_ok=True)
    stem = raw_dir / f"{args.size}"
    with tempfile.TemporaryDirectory() as tmp:
        points_json = Path(tmp) / "points.json"
        rep = nsys_tools.run_profile(
            nsys_path, stem, _inner_command(args, points_json), timeout=args.timeout, log=log
        )
        rows = json.loads(points_json.read_text())
    stats: dict[str, Path] = {}
    try:
        db = nsys_tools.export_sqlite(nsys_path, rep, timeout=args.timeout, log=log)
    except nsys_tools.NsysError as exc:
        db, export_error = None, exc
    try:  # the stats CSVs are for people, and the fallback when the SQLite cannot be read
        stats = nsys_tools.stats_csv(nsys_path, rep, timeout=args.timeout, log=log)
    except nsys_tools.NsysError as exc:
        print(f"[profile] nsys stats failed (kept going): {exc}", flush=True)
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
        print(f"[profile] {reason}; using nsys stats cuda_gpu_kern_sum", flush=True)
        capture = nsys_tools.read_stats_csv(stats["cuda_gpu_kern_sum"])
        for row in rows:
            row["profiler_note"] = reason
        return Capture(rows, None, summary=summary_from_kern_sum(capture, args.steps, "all"))
    per_point = {row["point"]: _ranges_of_point(ranges, row["point"]) for row in rows}
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


def run(args) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Profile one size with the chosen profiler (falling back to torch.profiler); returns
    (point rows, kernel rows), both with provenance."""
    cuda = torch.cuda.is_available() and args.device in ("auto", "cuda")
    profiler, detail = choose_profiler(args.profiler, args.nsys or None, cuda)
    note = "" if profiler == PROFILER_NSYS else detail
    raw_dir = Path(args.raw_dir)
    raw_dir.mkdir(parents=True, exist_ok=True)
    capture = None
    if profiler == PROFILER_NSYS:
        with open(raw_dir / f"{args.size}.nsys.log", "w") as log:
            try:
                capture = profile_with_nsys(args, detail, raw_dir, log)
            except (nsys_tools.NsysError, OSError, ValueError, KeyError) as exc:
                note = f"nsys failed ({str(exc)[:200]}); fell back to torch.profiler"
                print(f"[profile] {note}", flush=True)
                profiler = PROFILER_TORCH_CUDA if cuda else PROFILER_TORCH_CPU
    if capture is None:
        capture = profile_with_torch(args, raw_dir / f"{args.size}_traces")

    spec = size_spec(args.size)
    base = {
        **provenance(args.machine, args.preset),
        "size": args.size,
        "d_model": spec["d_model"],
        "num_heads": spec["num_heads"],
        "num_layers": spec["num_layers"],
        "precision": args.precision,
        "attention": "naive_annotated",
        "batch_size": args.batch_size,
        "warmup_steps": args.warmup,
        "measure_steps": args.steps,
        "profiler": profiler,
        "profiler_note": note,
    }
    if capture.att is not None:
        kernels = summarize_kernels(capture.att, args.steps)
    else:
        kernels = capture.summary
    point_rows = []
    for row in capture.rows:
        out = {**base, **row}
        if row.get("status") == "ok" and capture.att is not None:
            sub = capture.att[capture.att["point"] == row["point"]]
            ranges = capture.ranges.get(row["point"], pd.DataFrame())
            out.update(summarize_point(sub, ranges, args.steps))
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


def _ranges_of_point(ranges: pd.DataFrame, point: str) -> pd.DataFrame:
    """The ranges inside the ``point <label>`` range (an nsys capture holds every point)."""
    own = ranges[ranges["name"] == f"point {point}"]
    if own.empty:
        return ranges.iloc[0:0]
    start, end = int(own["start_ns"].iloc[0]), int(own["end_ns"].iloc[0])
    return ranges[(ranges["start_ns"] >= start) & (ranges["end_ns"] <= end)]


def _csv_list(text: str, cast=str) -> list:
    return [cast(x) for x in str(text).split(",") if x]


def _bool(text: str) -> bool:
    if str(text).lower() in ("1", "true", "yes", "on"):
        return True
    if str(text).lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def _add_point_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--size", required=True)
    p.add_argument("--contexts", type=lambda s: _csv_list(s, int), required=True)
    p.add_argument("--modes", type=_csv_list, default=list(MODES))
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--device", default="auto")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    run_p = sub.add_parser("run", help="profile one model size (the rule's job)")
    _add_point_args(run_p)
    run_p.add_argument("--machine", required=True)
    run_p.add_argument("--preset", required=True)
    run_p.add_argument("--profiler", choices=("auto", "nsys", "torch"), default="auto")
    run_p.add_argument("--nsys", default="", help="path to nsys (else $NSYS, else PATH)")
    run_p.add_argument("--timeout", type=float, default=None, help="seconds per nsys command")
    run_p.add_argument("--raw-dir", required=True)
    run_p.add_argument("--keep-raw", type=_bool, default=True)
    run_p.add_argument("--out", required=True)
    run_p.add_argument("--kernels-out", required=True)
    cap = sub.add_parser("capture", help="(internal) the measurement nsys profiles")
    _add_point_args(cap)
    cap.add_argument("--points-out", required=True)
    args = ap.parse_args(argv)
    for mode in args.modes:
        if mode not in MODES:
            ap.error(f"unknown mode {mode!r}; known: {MODES}")

    if args.cmd == "capture":
        control = _CudaProfilerControl()
        rows = run_points(args, control)
        control.stop()
        Path(args.points_out).write_text(json.dumps(rows))
        return

    t0 = time.perf_counter()
    points, kernels = run(args)
    write_csv(points, args.out)
    write_csv(kernels, args.kernels_out)
    print(
        f"wrote {args.out} ({len(points)} points, {int((points['status'] != 'ok').sum())} not ok) "
        f"and {args.kernels_out} ({len(kernels)} kernel rows) in {time.perf_counter() - t0:.1f} s",
        flush=True,
    )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
