"""Attribution of GPU (or CPU) kernels to the profiler ranges they ran in: the step, its phase
(forward, backward, optimizer) and the parts of attention; and the per-kernel summaries.

Profiler-independent: it reads kernel and range tables whichever profiler wrote them.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from cs336_systems.core.harness import summarize
from cs336_systems.core.phases import MARKERS, PHASES
from cs336_systems.profiling.annotated_attention import ATTENTION_PARTS, ATTENTION_RANGE
from cs336_systems.profiling.kernel_classes import classify_kernel, short_kernel_name

ATTENTION_GROUPS = (ATTENTION_RANGE, *(f"{ATTENTION_RANGE}.{p}" for p in ATTENTION_PARTS))
# every group a kernel can be summarized under: the whole step, its phase, attention (parts)
GROUPS = ("step", *PHASES, *ATTENTION_GROUPS)


_POINT_RE = re.compile(r"^point (\d+)/(\w+)$")


_STEP_RE = re.compile(r"^step (\d+)$")


def point_range_name(context_length: int, mode: str) -> str:
    return f"point {context_length}/{mode}"


def group_column(group: str) -> str:
    """`attention.softmax` -> `attention_softmax` (a column-name-safe group name)."""
    return group.replace(".", "_")


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

    marks = ranges[ranges["name"].isin(list(MARKERS))].sort_values("start_ns")
    mt = marks["start_ns"].to_numpy(dtype=np.int64)
    mi = np.searchsorted(mt, t, side="right") - 1
    mlabel = marks["name"].map(MARKERS).to_numpy(dtype=object)
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


def ranges_of_point(ranges: pd.DataFrame, point: str) -> pd.DataFrame:
    """The ranges inside the ``point <label>`` range (an nsys capture holds every point)."""
    own = ranges[ranges["name"] == f"point {point}"]
    if own.empty:
        return ranges.iloc[0:0]
    start, end = int(own["start_ns"].iloc[0]), int(own["end_ns"].iloc[0])
    return ranges[(ranges["start_ns"] >= start) & (ranges["end_ns"] <= end)]
