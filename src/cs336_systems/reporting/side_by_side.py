"""Times measured beside other jobs against the same points measured alone.

    python -m cs336_systems.reporting.side_by_side results/h200-x4 results/h200-x4-alone \
        --out docs/measured-runs.md

The first folder is a run whose jobs shared the host (four cards, a job each); the second holds
the same jobs run one at a time (`scripts/gpu/alone.sh`: `--resources gpu_jobs=1`, its own
machine tag). Rows of a stage CSV both folders hold are matched by the point columns they share
(reporting/sanity.py `POINT_KEYS`; a point's n-th row with its n-th), status ok in both; each timing column (`<x>_ms_mean` with
its `<x>_ms_std`) is one line: alone (mean ± std), beside others (mean ± std, and the jobs that
ran beside it: the row's `measured_beside`, else the run's job records, planning/neighbours.py),
their ratio and a verdict. They agree where the means differ by at most twice the combined
spread (the root of the stds' squares) or by at most 3%. The table is written between
`<!-- side-by-side:start -->` and `<!-- side-by-side:end -->` of `--out` (appended where absent),
or printed.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

from cs336_systems.planning import neighbours
from cs336_systems.reporting.sanity import BESIDE, POINT_KEYS, RECORDS

START, END = "<!-- side-by-side:start -->", "<!-- side-by-side:end -->"
# the means agree within this many combined standard deviations, or within this fraction
AGREE_STDS = 2.0
AGREE_FRACTION = 0.03
COLUMNS = ["stage", "row", "time", "alone (ms)", "beside others (ms)", "beside", "ratio", "verdict"]


def verdict(alone: tuple[float, float], beside: tuple[float, float]) -> str:
    """'agree', 'slower beside others' or 'faster beside others' ((mean, std) each)."""
    (ma, sa), (mb, sb) = alone, beside
    spread = math.hypot(sa if sa == sa else 0.0, sb if sb == sb else 0.0)
    diff = mb - ma
    if abs(diff) <= AGREE_STDS * spread or abs(diff) <= AGREE_FRACTION * abs(ma):
        return "agree"
    return "slower beside others" if diff > 0 else "faster beside others"


def timing_columns(df: pd.DataFrame) -> list[str]:
    """The `<x>_ms` statistics with a mean and a std ('step_ms', 'fwd_ms', ...)."""
    return [c[:-5] for c in df.columns if c.endswith("_ms_mean") and f"{c[:-5]}_std" in df]


def _ran(df: pd.DataFrame) -> pd.DataFrame:
    return (df[df["status"].astype(str) == "ok"] if "status" in df else df).copy()


def _beside(row: pd.Series, records: dict) -> str:
    named = row.get(BESIDE)
    if isinstance(named, str) and named:
        return _short(named)
    job = row.get("job_id")
    found = neighbours.neighbours(records, str(job)) if isinstance(job, str) else []
    return _short("; ".join(found)) if found else "none"


def _short(named: str) -> str:
    """'benchmark results/m/benchmark/points/10B_ctx512_naive.csv; ...' as 'benchmark
    10B_ctx512_naive, ...': each neighbour's stage and the file it wrote, by its stem."""
    jobs = [n.strip().split(" ", 1) for n in named.split(";") if n.strip()]
    return ", ".join(f"{j[0]} {Path(j[1]).stem}" if len(j) == 2 else j[0] for j in jobs)


def _fmt(mean: float, std: float) -> str:
    return f"{mean:.4g} ± {std:.2g}" if std == std else f"{mean:.4g}"


def compare_stage(stage: str, beside: pd.DataFrame, alone: pd.DataFrame, records: dict) -> list:
    """The stage's matched rows, one line per point and timing column."""
    keys = [k for k in POINT_KEYS if k in beside and k in alone]
    times = [t for t in timing_columns(beside) if t in timing_columns(alone)]
    if not keys or not times:
        return []
    # a point measured more than once (the same keys) matches its n-th row with the n-th
    b, a = (_ran(df).assign(_nth=lambda d: d.groupby(keys, dropna=False).cumcount())
            for df in (beside, alone))  # fmt: skip
    merged = b.merge(a, on=[*keys, "_nth"], how="inner", suffixes=("", "_alone"))
    lines = []
    for _, row in merged.iterrows():
        label = ", ".join(f"{k}={row[k]}" for k in keys if pd.notna(row[k]))
        for t in times:
            mb, sb = float(row[f"{t}_mean"]), float(row[f"{t}_std"])
            ma, sa = float(row[f"{t}_mean_alone"]), float(row[f"{t}_std_alone"])
            if not (ma == ma and mb == mb) or ma == 0:
                continue
            lines.append(
                [
                    stage,
                    label,
                    t,
                    _fmt(ma, sa),
                    _fmt(mb, sb),
                    _beside(row, records),
                    f"{mb / ma:.3f}",
                    verdict((ma, sa), (mb, sb)),
                ]  # fmt: skip
            )
    return lines


def compare(beside_dir: Path, alone_dir: Path) -> pd.DataFrame:
    """Every stage CSV both folders hold, matched row by row."""
    records = neighbours.read(Path(beside_dir) / RECORDS)
    lines = []
    for path in sorted(Path(beside_dir).glob("*.csv")):
        other = Path(alone_dir) / path.name
        if other.exists():
            lines += compare_stage(path.stem, pd.read_csv(path), pd.read_csv(other), records)
    return pd.DataFrame(lines, columns=COLUMNS)


def markdown(table: pd.DataFrame, beside_dir: Path, alone_dir: Path) -> str:
    """A count of the verdicts per stage, the timings that do not agree, then every timing
    (in a collapsed block)."""
    head = (
        f"Beside others: `{Path(beside_dir).name}`; alone: `{Path(alone_dir).name}` "
        f"(`python -m cs336_systems.reporting.side_by_side`). Agree: the means within "
        f"{AGREE_STDS:g} combined std or {AGREE_FRACTION:.0%}."
    )
    if not len(table):
        return "\n".join([head, "", "No matching rows."])
    counts = table.groupby("stage")["verdict"].value_counts().unstack(fill_value=0)
    verdicts = list(counts.columns)
    summary = ["| stage | timings | " + " | ".join(verdicts) + " |",
               "|---|---:|" + "---:|" * len(verdicts)]  # fmt: skip
    summary += [f"| {s} | {int(r.sum())} | " + " | ".join(str(int(r[v])) for v in verdicts) + " |"
                for s, r in counts.iterrows()]  # fmt: skip
    off = table[table["verdict"] != "agree"]
    parts = [head, "", f"{len(table)} timings compared:", "", *summary, ""]
    if len(off):
        parts += [f"The {len(off)} that do not agree:", "", *_rows(off), ""]
    parts += ["<details><summary>Every timing compared</summary>", "", *_rows(table), "",
              "</details>"]  # fmt: skip
    return "\n".join(parts)


def _rows(table: pd.DataFrame) -> list[str]:
    rows = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * 3 + "---:|" * 2 + "---|---:|---|"]
    return rows + [
        "| " + " | ".join(str(v) for v in r) + " |" for r in table.itertuples(index=False)
    ]


def between_markers(text: str, body: str) -> str:
    """`text` with `body` between the markers (the markers and body appended where absent)."""
    block = f"{START}\n{body}\n{END}"
    if START in text and END in text:
        before, rest = text.split(START, 1)
        return before + block + rest.split(END, 1)[1]
    return text.rstrip("\n") + "\n\n" + block + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("beside", type=Path, help="results/<machine>: jobs side by side")
    ap.add_argument("alone", type=Path, help="results/<machine>-alone: the same jobs alone")
    ap.add_argument("--out", type=Path, help="a markdown file to write the table into")
    args = ap.parse_args(argv)
    body = markdown(compare(args.beside, args.alone), args.beside, args.alone)
    if args.out is None:
        sys.stdout.write(body + "\n")
        return
    old = args.out.read_text() if args.out.exists() else ""
    args.out.write_text(between_markers(old, body))


if __name__ == "__main__":
    main()
