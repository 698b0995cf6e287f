"""Nsight Systems from Python: find `nsys`, profile a command, turn the report into tables.

- `find_nsys(setting)`: an explicit path (config) wins, then the ``NSYS`` environment variable,
  then ``nsys`` on PATH; ``None`` when there is none (callers fall back to torch.profiler).
- `profile_command(...)`: an ``nsys profile`` command line that records CUDA and NVTX only, and
  only between ``cudaProfilerStart`` and ``cudaProfilerStop`` (the measured steps), so the
  capture stays small.
- `export_sqlite`, `stats_csv`: the report as SQLite, and ``nsys stats`` CSVs
  (``cuda_gpu_kern_sum``, ``nvtx_sum``, ``nvtx_kern_sum``, ``nvtx_gpu_proj_sum``).
- `read_stats_csv`: one of those CSVs as a DataFrame with snake_case columns (times in ns).
- `events_from_sqlite`: every kernel (name, GPU start/end, host launch time) and every NVTX range
  from the SQLite export. The profile stage attributes kernels to ranges by the *time* the
  kernel was launched, not by thread: backward kernels are launched from the autograd engine's
  thread, outside the main thread's NVTX stack, which `nvtx_kern_sum` (same-thread matching)
  would miss.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import sqlite3
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

# the summaries kept next to a capture (nvtx_gpu_proj_sum is slow on big captures: on request)
STATS_REPORTS = ("cuda_gpu_kern_sum", "nvtx_sum")
# NVTX_EVENTS.eventType of push/pop and start/end ranges (NVTX and NVTXT)
_RANGE_EVENT_TYPES = (59, 60, 70, 71)


class NsysError(RuntimeError):
    """nsys is missing, or a command of it failed; the message says which and why."""


def find_nsys(setting: str | None = None) -> str | None:
    """Path of a usable `nsys`: `setting` (a path or a name on PATH), then $NSYS, then PATH."""
    for candidate in (setting, os.environ.get("NSYS"), "nsys"):
        if not candidate:
            continue
        path = Path(candidate).expanduser()
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
        found = shutil.which(candidate)
        if found:
            return found
    return None


def _run(cmd: Sequence[str], timeout: float | None, what: str, log=None) -> str:
    try:
        proc = subprocess.run(
            list(cmd), capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NsysError(f"{what}: {type(exc).__name__}: {exc}") from exc
    out = (proc.stdout or "") + (proc.stderr or "")
    if log is not None:
        log.write(f"$ {' '.join(cmd)}\n{out}\n")
        log.flush()
    if proc.returncode != 0:
        tail = " | ".join(out.strip().splitlines()[-3:])
        raise NsysError(f"{what} exited with {proc.returncode}: {tail[:300]}")
    return out


def version(nsys: str, timeout: float = 60) -> str:
    return _run([nsys, "--version"], timeout, "nsys --version").strip().splitlines()[-1]


def profile_command(
    nsys: str,
    output: str | os.PathLike,
    command: Sequence[str],
    capture_range: str = "cudaProfilerApi",
    extra: Sequence[str] = (),
) -> list[str]:
    """`nsys profile` recording CUDA + NVTX inside the capture range only (no CPU sampling)."""
    cmd = [
        nsys,
        "profile",
        "--trace=cuda,nvtx",
        "--sample=none",
        "--cpuctxsw=none",
        "--force-overwrite=true",
        f"--output={output}",
    ]
    if capture_range == "cudaProfilerApi":
        # `stop`: end collection at cudaProfilerStop but let the program finish its own work
        cmd += ["--capture-range=cudaProfilerApi", "--capture-range-end=stop"]
    elif capture_range != "none":
        raise ValueError(f"unknown capture range {capture_range!r}")
    return [*cmd, *extra, *command]


def run_profile(
    nsys: str,
    output: str | os.PathLike,
    command: Sequence[str],
    timeout: float | None = None,
    log=None,
    capture_range: str = "cudaProfilerApi",
    extra: Sequence[str] = (),
) -> Path:
    """Profile `command`; returns the `.nsys-rep` (raises NsysError when none came out)."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    rep = output.with_name(output.name + ".nsys-rep")
    rep.unlink(missing_ok=True)
    _run(profile_command(nsys, output, command, capture_range, extra), timeout, "nsys profile", log)
    if not rep.exists():
        qd = list(output.parent.glob(output.name + "*.qdstrm"))
        hint = " (only a .qdstrm: the importer failed; is libdw on LD_LIBRARY_PATH?)" if qd else ""
        raise NsysError(f"nsys profile wrote no {rep.name}{hint}")
    return rep


def export_sqlite(nsys: str, rep: str | os.PathLike, timeout: float | None = None, log=None):
    rep = Path(rep)
    db = rep.with_suffix(".sqlite")
    _run(
        [nsys, "export", "--type=sqlite", "--force-overwrite=true", f"--output={db}", str(rep)],
        timeout,
        "nsys export",
        log,
    )
    if not db.exists():
        raise NsysError(f"nsys export wrote no {db.name}")
    return db


def stats_csv(
    nsys: str,
    rep: str | os.PathLike,
    reports: Sequence[str] = STATS_REPORTS,
    timeout: float | None = None,
    log=None,
    force_export: bool = False,
) -> dict[str, Path]:
    """Run `nsys stats --format csv` for `reports`; {report: csv path} of those written.

    It reuses an up-to-date SQLite export next to the report (make one first with
    `export_sqlite`) unless `force_export`."""
    rep = Path(rep)
    prefix = rep.with_suffix("")
    _run(
        [
            nsys,
            "stats",
            "--format=csv",
            f"--force-export={'true' if force_export else 'false'}",
            "--force-overwrite=true",
            f"--report={','.join(reports)}",
            f"--output={prefix}",
            str(rep),
        ],
        timeout,
        "nsys stats",
        log,
    )
    found = {}
    for report in reports:
        matches = sorted(prefix.parent.glob(f"{prefix.name}*{report}*.csv"))
        if matches:
            found[report] = matches[0]
    return found


# ---------------------------------------------------------------------------------------------
# Parsing


_COLUMN_ALIASES = {
    "time": "time_pct",
    "time_%": "time_pct",
    "total_time": "total_ns",
    "instances": "instances",
    "avg": "avg_ns",
    "med": "med_ns",
    "min": "min_ns",
    "max": "max_ns",
    "stddev": "std_ns",
    "name": "name",
    "kernel_name": "name",
    "range": "range",
    "nvtx_range": "range",
    "style": "style",
    "nvtx_inst": "range_instances",
    "range_instances": "range_instances",
    "kern_inst": "instances",
    "total_proj_time": "proj_total_ns",
    "total_range_time": "range_total_ns",
    "proj_avg": "proj_avg_ns",
    "proj_med": "proj_med_ns",
    "proj_min": "proj_min_ns",
    "proj_max": "proj_max_ns",
    "proj_stddev": "proj_std_ns",
    "total_gpu_ops": "gpu_ops",
    "pid": "pid",
    "tid": "tid",
}
_UNIT_FACTORS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}


def _canonical_column(header: str) -> tuple[str, float]:
    """'Total Time (ns)' -> ('total_ns', 1); 'Avg (us)' -> ('avg_ns', 1000); 'Time (%)' -> pct."""
    text = header.strip()
    unit = re.search(r"\((ns|us|ms|s|%)\)\s*$", text)
    factor = 1.0
    if unit:
        text = text[: unit.start()].strip()
        if unit.group(1) == "%":
            text += " %"
        else:
            factor = _UNIT_FACTORS[unit.group(1)]
    key = re.sub(r"[^a-z0-9%]+", "_", text.lower()).strip("_")
    return _COLUMN_ALIASES.get(key, key), factor


def read_stats_csv(source: str | os.PathLike) -> pd.DataFrame:
    """One `nsys stats --format csv` table (path or text) with canonical snake_case columns.

    Lines before the header (NOTICE:, "Processing ...", "Generating SQLite file ...") are
    skipped; times are converted to ns; NVTX range names lose the default domain's ':' prefix.
    """
    text = Path(source).read_text() if _looks_like_path(source) else str(source)
    lines = text.splitlines()
    start = next(
        (i for i, line in enumerate(lines) if line.count(",") >= 2 and _is_header(line)), None
    )
    if start is None:
        return pd.DataFrame()
    body = []
    for line in lines[start:]:
        if not line.strip():
            break
        body.append(line)
    rows = list(csv.reader(io.StringIO("\n".join(body))))
    header, data = rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]
    columns, factors = zip(*(_canonical_column(h) for h in header), strict=True)
    df = pd.DataFrame(data, columns=list(columns))
    for col, factor in zip(columns, factors, strict=True):
        if col in ("name", "range", "style"):
            continue
        values = pd.to_numeric(df[col].astype(str).str.replace(",", ""), errors="coerce")
        df[col] = values * factor if factor != 1.0 else values
    if "range" in df:
        df["range"] = df["range"].astype(str).map(normalize_range_name)
    return df


def _looks_like_path(source) -> bool:
    if isinstance(source, os.PathLike):
        return True
    return "\n" not in str(source) and len(str(source)) < 4096 and Path(str(source)).exists()


def _is_header(line: str) -> bool:
    low = line.lower()
    return any(k in low for k in ("total time", "total proj time", "instances", "kern inst"))


def normalize_range_name(name: str) -> str:
    """NVTX ranges of the default domain print as ':name'; keep just the name."""
    return str(name).strip().removeprefix(":")


# ---------------------------------------------------------------------------------------------
# SQLite export -> events


def _tables(con: sqlite3.Connection) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def events_from_sqlite(db: str | os.PathLike) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(kernels, ranges) from an nsys SQLite export.

    kernels: name, start_ns, end_ns (GPU execution), launch_ns (host time of the CUDA API call
    that launched it, runtime or driver API; the GPU start when no call matches), matched
    (whether a launching call was found), tid.
    ranges: name, start_ns, end_ns, tid (NVTX push/pop and start/end ranges, closed ones).
    """
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        tables = _tables(con)
        if "CUPTI_ACTIVITY_KIND_KERNEL" not in tables:
            kernels = pd.DataFrame(
                columns=["name", "start_ns", "end_ns", "launch_ns", "matched", "tid"]
            )
        else:
            runtime = "CUPTI_ACTIVITY_KIND_RUNTIME" in tables
            join = (
                "LEFT JOIN CUPTI_ACTIVITY_KIND_RUNTIME AS r ON r.correlationId = k.correlationId"
                " AND (r.globalTid >> 24) = (k.globalPid >> 24)"
                if runtime
                else ""
            )
            launch = "coalesce(r.start, k.start)" if runtime else "k.start"
            matched = "r.start IS NOT NULL" if runtime else "0"
            tid = "r.globalTid & 16777215" if runtime else "NULL"
            kernels = pd.read_sql_query(
                f"SELECT coalesce(s.value, '') AS name, k.start AS start_ns, k.end AS end_ns,"
                f" {launch} AS launch_ns, {matched} AS matched, {tid} AS tid"
                " FROM CUPTI_ACTIVITY_KIND_KERNEL AS k"
                " LEFT JOIN StringIds AS s ON s.id = k.demangledName "
                f"{join} ORDER BY launch_ns",
                con,
            )
        if "NVTX_EVENTS" not in tables:
            ranges = pd.DataFrame(columns=["name", "start_ns", "end_ns", "tid"])
        else:
            types = ",".join(str(t) for t in _RANGE_EVENT_TYPES)
            ranges = pd.read_sql_query(
                "SELECT coalesce(ne.text, s.value, '') AS name, ne.start AS start_ns,"
                " ne.end AS end_ns, ne.globalTid & 16777215 AS tid"
                " FROM NVTX_EVENTS AS ne LEFT JOIN StringIds AS s ON s.id = ne.textId"
                f" WHERE ne.eventType IN ({types}) AND ne.end IS NOT NULL ORDER BY ne.start",
                con,
            )
    finally:
        con.close()
    return kernels, ranges


TRIMMED_TABLES = (
    "StringIds",
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "NVTX_EVENTS",
)


def trim_sqlite(
    src: str | os.PathLike, dst: str | os.PathLike, keep: Sequence[str] = TRIMMED_TABLES
) -> Path:
    """Copy only the tables `keep` (by default what `events_from_sqlite` reads: a small test
    fixture from a real export; `nsys_timeline.TABLES` for a timeline figure)."""
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.unlink(missing_ok=True)
    con = sqlite3.connect(str(dst))
    try:
        con.execute("ATTACH DATABASE ? AS src", (str(src),))
        present = {
            r[0] for r in con.execute("SELECT name FROM src.sqlite_master WHERE type='table'")
        }
        for table in keep:
            if table in present:
                con.execute(f"CREATE TABLE {table} AS SELECT * FROM src.{table}")
        con.commit()
        con.execute("DETACH DATABASE src")
        con.execute("VACUUM")
    finally:
        con.close()
    return dst
