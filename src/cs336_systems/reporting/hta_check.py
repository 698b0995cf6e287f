"""HolisticTraceAnalysis's numbers beside ours: for each profiled step that kept every rank's
trace (a folder under the stage's raw/, `profiling/overlap.py:rank_trace`), HTA's temporal
breakdown and communication-computation overlap per rank (`profiling/trace_breakdown.py`)
beside the stage's own (rank 0's row), the difference shown, and where they differ by more
than a tenth a sentence saying which of HTA's definitions makes the difference, computed by
turning them into ours one at a time. Where nothing can be set beside ours, the reason,
computed from the files: no traces kept, or traces without GPU kernels (a CPU gloo run).

Reading a GPU run's traces (tens of MB of JSON a rank and step) takes seconds each, so the
result is kept beside the stage's results (`cache_path`: `<stage>/hta.json`) under a key of
the rows and the trace files (names, sizes, times): the stage's plots job writes it beside the
measurements, and the report reads it back unless a row or a trace changed since."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pandas as pd

from cs336_systems.profiling.trace_breakdown import (
    SWITCHES,
    RankTrace,
    breakdown,
    evidence,
    read_folder,
)
from cs336_systems.reporting.analysis import fmt, md_table, pct

# a difference above this share of ours is explained
TOLERANCE = 0.10

# (measure, what it is, ours from the stage's row: a column or a function of the row)
MEASURES = (
    ("overlap", "NCCL time during compute", "prof_overlap_share"),
    ("comm_ms", "NCCL kernel time (ms)", "prof_comm_kernel_ms"),
    ("communication_ms", "communication, no compute (ms)", "prof_comm_exposed_ms"),
    (
        "compute_ms",
        "compute (ms)",
        lambda r: _num(r, "prof_gpu_busy_ms") - _num(r, "prof_comm_exposed_ms"),
    ),
    ("memory_ms", "memory and other kernels alone (ms)", None),
    ("idle_ms", "GPU idle (ms)", "prof_gpu_idle_ms"),
    ("window_ms", "span (ms)", "prof_step_ms"),
)


def _num(row: pd.Series, column: str) -> float:
    try:
        return float(row.get(column, math.nan))
    except (TypeError, ValueError):
        return math.nan


def ours(row: pd.Series, measure: str) -> float:
    """The stage's own number for `measure` (NaN where it has none: memory, which ours counts
    as compute)."""
    source = next(src for key, _, src in MEASURES if key == measure)
    if source is None:
        return math.nan
    return source(row) if callable(source) else _num(row, source)


def differs(hta: float, our: float) -> bool:
    """Whether HTA's number is more than TOLERANCE of ours away (both known)."""
    if math.isnan(hta) or math.isnan(our):
        return False
    return abs(hta - our) > TOLERANCE * abs(our) if our else hta != 0


def _show(measure: str, x: float) -> str:
    return pct(x) if measure == "overlap" else fmt(x)


def difference(measure: str, hta: float, our: float) -> str:
    """HTA's less ours: points for the share, ms and share of ours for a time."""
    if math.isnan(hta) or math.isnan(our):
        return "–"
    if measure == "overlap":
        return f"{100 * (hta - our):+.1f} pt"
    gap = round(hta - our, 6)  # to the nanosecond: no float dust
    rel = f" ({gap / our:+.0%})" if our else ""
    return f"{'+' if gap >= 0 else ''}{fmt(gap)} ms{rel}"


# what each of HTA's definitions does to a trace, from `evidence` (one per SWITCHES)
WHY = {
    "step_only": lambda e: (
        f"HTA counts every kernel of the trace, {e['before_n']} of them before the step's range "
        f"({fmt(e['before_comm_ms'])} ms of them NCCL), which ours leaves out"
    ),
    "exact": lambda e: (
        "HTA rounds each kernel's start up and its end down to whole microseconds, "
        f"{fmt(e['rounding_ms'])} ms less kernel time over {e['rounding_n']} kernels"
    ),
    "our_classes": lambda e: (
        f"HTA counts {e['apart_n']} copy, memset or sync kernels ({fmt(e['apart_ms'])} ms) as "
        "no compute, ours as compute"
    ),
    "our_window": lambda e: (
        "HTA's span runs from the first kernel to the last, ours from the step's start on the "
        f"host ({fmt(e['lead_ms'])} ms before its first kernel) to the later of its end and "
        "the last kernel's"
    ),
}


def ladder(t: RankTrace) -> list[dict[str, float]]:
    """HTA's numbers, then with the first 1, 2, ... of SWITCHES turned into ours."""
    return [breakdown(t, SWITCHES[:i]) for i in range(len(SWITCHES) + 1)]


def explain(run: str, t: RankTrace, steps: list[dict], measure: str, our: float) -> str:
    """One sentence: HTA's number against ours, and which of HTA's definitions, turned into
    ours in SWITCHES' order, bring it within TOLERANCE of ours (those that move it), or that
    none does."""
    label = next(text for key, text, _ in MEASURES if key == measure)
    values = [s[measure] for s in steps]
    e = evidence(t)
    moved = [WHY[s](e) for i, s in enumerate(SWITCHES) if values[i + 1] != values[i]]
    head = f"{run}, rank {t.rank}, {label}: HTA {_show(measure, values[0])}, ours "
    head += _show(measure, our)
    closed = next((i for i in range(1, len(values)) if not differs(values[i], our)), None)
    if closed is None:
        rest = f" ({'; '.join(moved)})" if moved else ""
        return (
            f"{head}. With all of ours' definitions HTA's method reads "
            f"{_show(measure, values[-1])}, still more than {TOLERANCE:.0%} off: the rest is "
            f"not in these definitions{rest}."
        )
    used = [WHY[s](e) for i, s in enumerate(SWITCHES[:closed]) if values[i + 1] != values[i]]
    return f"{head}: {'; '.join(used)}; with ours' it reads {_show(measure, values[closed])}."


def _rows(run: str, row: pd.Series, t: RankTrace) -> tuple[list[dict], list[str]]:
    """The table's rows of one rank (ours: rank 0's only, the stage's row) and its sentences."""
    steps = ladder(t)
    rows, lines = [], []
    for measure, label, _ in MEASURES:
        hta = steps[0][measure]
        our = ours(row, measure) if t.rank == 0 else math.nan
        rows.append(
            {
                "run": run,
                "rank": t.rank,
                "measure": label,
                "ours": _show(measure, our),
                "HTA": _show(measure, hta),
                "difference": difference(measure, hta, our),
            }
        )
        if differs(hta, our):
            lines.append(explain(run, t, steps, measure, our))
    return rows, lines


def why_empty(named: list[str], runs: dict[str, dict[int, RankTrace]], raw_dir: Path) -> str:
    """Why no trace gives HTA's numbers: none kept, none found, or none with GPU kernels."""
    if not named:
        return (
            "No profiled step kept its traces (the stage's `profile` knob or the run's "
            "`keep_raw` is off), so HolisticTraceAnalysis has nothing to read."
        )
    traces = [t for ranks in runs.values() for t in ranks.values()]
    if not traces:
        return f"The trace folders the rows name ({', '.join(named)}) are not in {raw_dir}."
    gloo = sum(t.gloo_events for t in traces)
    host = sum(t.host_events for t in traces)
    kind = f", {gloo:,} of them gloo's collectives on worker threads (a CPU run)" if gloo else ""
    return (
        f"The {len(traces)} traces of {', '.join(runs)} hold no GPU kernels: {host:,} host "
        f"events{kind}. HolisticTraceAnalysis's breakdown and overlap read kernels on GPU "
        "streams only, so there is nothing to set beside ours."
    )


def cache_path(raw_dir: Path) -> Path:
    """Where `cross_check` keeps its result: `hta.json` beside the stage's raw/ folder."""
    return Path(raw_dir).parent / "hta.json"


def _key(raw_dir: Path, rows: pd.DataFrame) -> str:
    """What the result depends on: the rows' trace names and our numbers, and every file under
    `raw_dir` (path, size, modification time)."""
    raw_dir = Path(raw_dir)
    columns = ["trace", *(src for _, _, src in MEASURES if isinstance(src, str))]
    columns += ["prof_gpu_busy_ms", "prof_comm_exposed_ms"]
    shown = rows[[c for c in dict.fromkeys(columns) if c in rows]] if len(rows) else rows
    files = []
    if raw_dir.is_dir():
        for f in sorted(p for p in raw_dir.rglob("*") if p.is_file()):
            st = f.stat()
            files.append([f.relative_to(raw_dir).as_posix(), st.st_size, st.st_mtime_ns])
    doc = json.dumps([shown.astype(str).values.tolist() if len(shown) else [], files])
    return hashlib.sha256(doc.encode()).hexdigest()


def cross_check(raw_dir: Path, rows: pd.DataFrame, keep: bool = False) -> dict:
    """`hta_table` (per run and rank: ours, HTA's, the difference), `hta_lines` (a sentence per
    difference above TOLERANCE) and `hta_empty` (why there is no table, else "") for the
    stage's `rows` (those that passed the checks) whose `trace` names a folder in `raw_dir`;
    read from `cache_path` where its key matches, else computed (and, with `keep`: the plots
    job, kept there; the report writes nothing beside the results it reads)."""
    cache, key = cache_path(raw_dir), _key(raw_dir, rows)
    try:
        kept = json.loads(cache.read_text())
        if kept.get("key") == key:
            return kept["result"]
    except (OSError, ValueError, KeyError, AttributeError):
        pass
    result = _cross_check(raw_dir, rows)
    if not keep:
        return result
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({"key": key, "result": result}, indent=1))
    except OSError:
        pass  # a read-only results folder: computed again next time
    return result


def _cross_check(raw_dir: Path, rows: pd.DataFrame) -> dict:
    named = [str(t) for t in rows.get("trace", pd.Series(dtype=str)).dropna() if str(t)]
    runs = {name: read_folder(Path(raw_dir) / name) for name in dict.fromkeys(named)}
    runs = {name: ranks for name, ranks in runs.items() if ranks}
    table, lines = [], []
    for _, row in rows.iterrows():
        for t in runs.get(str(row.get("trace", "")), {}).values():
            if t.kernels:
                more, said = _rows(str(row["trace"]), row, t)
                table += more
                lines += said
    if not table:
        return {"hta_table": "", "hta_lines": [], "hta_empty": why_empty(named, runs, raw_dir)}
    return {"hta_table": md_table(pd.DataFrame(table)), "hta_lines": lines, "hta_empty": ""}
