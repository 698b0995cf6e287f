"""A report that puts two or more machines' runs side by side.

    python -m cs336_systems.reporting.compare --out report/compare/cpu_vs_h100.md results/cpu results/h100

Each argument is a results folder (`results/<machine>/`, or any folder of stage CSVs such as a
committed reference's `csv/`); the first is the baseline every ratio is taken against. Per
stage, the numbers come from what the stage declares in its package's `__init__.py`::

    COMPARE = {
        "<csv name>": {
            "keys": [...],                  # columns that name a point: matched across machines
            "values": {"<column>": "label", ...},
            "headlines": [                  # one number per machine, over matched points
                {"label": "...", "column": "...", "agg": "max", "where": {"mode": "train_step"}},
            ],
            "own_scale": ["mfu"],           # values against each machine's own ceiling
            "exclude": [{"impl": "flash_triton", "device": "cpu"}],  # not the same measurement
            "only": {"best": True},         # the rows that stand for a point
        },
    }

Only like is divided by like. Only rows that ran and passed the sanity checks count
(reporting/sanity.py); rows a stage excludes (a kernel run in an interpreter is not the kernel) do not
count; a point is compared only where every machine measured it, and a headline is computed over
those matched points only (a median over two different grids compares the grids). A number taken
against each machine's own ceiling (an MFU) is shown side by side, never divided.
"""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path

import pandas as pd

from cs336_systems.core.results import atomic_write_text
from cs336_systems.planning.log import configure, get_logger
from cs336_systems.reporting import report
from cs336_systems.reporting.analysis import load, md_table, ok, sig

log = get_logger(__name__)
MAX_POINTS = 24
AGGS = {"max": "max", "min": "min", "median": "median", "mean": "mean", "count": "count"}


def declared(stage: str) -> dict:
    return getattr(report.stage_package(stage), "COMPARE", {})


def loader(stage: str, name: str):
    """How the stage's analysis reads CSV `name` (its `LOADERS`, e.g. the benchmark's MFU
    against the model's paths), else `reporting.analysis.load`."""
    import importlib

    module = importlib.import_module(f"cs336_systems.stages.{stage}.analysis")
    return getattr(module, "LOADERS", {}).get(name, lambda d: load(d, name))


def machine_label(results_dir: Path) -> str:
    """The machine tag its rows carry (else the folder's name)."""
    prov = report.read_provenance(sorted(Path(results_dir).glob("*.csv")))
    tags = report._values(prov, "machine")
    return tags[0] if len(tags) == 1 else Path(results_dir).name


def _filter(df: pd.DataFrame, where: dict | None) -> pd.DataFrame:
    for col, value in (where or {}).items():
        if col not in df:
            return df.iloc[0:0]
        df = df[df[col].isin(value if isinstance(value, list) else [value])]
    return df


def _exclude(df: pd.DataFrame, rules: list[dict] | None) -> pd.DataFrame:
    """`df` without the rows any rule matches (every column of the rule equal)."""
    for rule in rules or []:
        if all(c in df for c in rule):
            hit = pd.Series(True, index=df.index)
            for col, value in rule.items():
                hit &= df[col].astype(str) == str(value)
            df = df[~hit]
    return df


def _only(df: pd.DataFrame, where: dict | None) -> pd.DataFrame:
    """The rows a stage compares (e.g. the best of several ceiling measurements); a CSV without
    the column (written before it existed) is kept whole."""
    for col, value in (where or {}).items():
        if col in df:
            df = df[df[col].astype(str) == str(value)]
    return df


def matched(frames: dict[str, pd.DataFrame], keys: list[str]) -> dict[str, pd.DataFrame]:
    """Each machine's rows at the points (`keys`) every machine measured."""
    keys = [k for k in keys if all(k in d for d in frames.values())]
    if not keys:
        return {m: d.iloc[0:0] for m, d in frames.items()}
    common = None
    for d in frames.values():
        idx = pd.MultiIndex.from_frame(d[keys].astype(str))
        common = idx if common is None else common.intersection(idx)
    return {
        m: d[pd.MultiIndex.from_frame(d[keys].astype(str)).isin(common)] for m, d in frames.items()
    }


def headline(df: pd.DataFrame, spec: dict) -> float:
    d = _filter(ok(df), spec.get("where"))
    col = spec["column"]
    if col not in d or len(d) == 0:
        return float("nan")
    values = pd.to_numeric(d[col], errors="coerce").dropna()
    if len(values) == 0:
        return float("nan")
    return float(getattr(values, AGGS[spec.get("agg", "median")])()) * spec.get("scale", 1)


def _ratio(a: float, b: float) -> str:
    if a != a or b != b or a == 0:
        return "–"
    return f"{sig(b / a)}×"


def headlines_table(
    frames: dict[str, pd.DataFrame], specs: list[dict], own_scale: list[str] | None = None
) -> pd.DataFrame:
    """One number per machine over the matched points (`frames` hold only those), and its ratio
    to the baseline's, except for a number on each machine's own scale (`own_scale`)."""
    labels = list(frames)
    rows = []
    for spec in specs:
        vals = {m: headline(frames[m], spec) for m in labels}
        if all(v != v for v in vals.values()):
            continue
        row = {"number": spec["label"]}
        row.update({m: sig(v) for m, v in vals.items()})
        own = spec["column"] in (own_scale or [])
        for m in labels[1:]:
            row[f"{m} / {labels[0]}"] = (
                "– (each against its own ceiling)" if own else _ratio(vals[labels[0]], vals[m])
            )
        rows.append(row)
    return pd.DataFrame(rows)


def points_table(
    frames: dict[str, pd.DataFrame],
    keys: list[str],
    values: dict[str, str],
    own_scale: list[str] | None = None,
) -> tuple[pd.DataFrame, dict[str, int]]:
    """Points every machine measured (matched on `keys`), each value per machine and its ratio
    to the baseline; and how many points each machine has that not all share."""
    labels = list(frames)
    usable = {m: ok(df) for m, df in frames.items()}
    keys = [k for k in keys if all(k in d for d in usable.values())]
    cols = [c for c in values if all(c in d for d in usable.values())]
    if not keys or not cols or any(len(d) == 0 for d in usable.values()):
        return pd.DataFrame(), {m: len(d) for m, d in usable.items()}
    indexed = {
        m: d.drop_duplicates(keys).set_index(keys)[cols].apply(pd.to_numeric, errors="coerce")
        for m, d in usable.items()
    }
    common = None
    for d in indexed.values():
        common = d.index if common is None else common.intersection(d.index)
    only = {m: int(len(d.index.difference(common))) for m, d in indexed.items()}
    rows = []
    for key in list(common)[:MAX_POINTS]:
        key = key if isinstance(key, tuple) else (key,)
        row = dict(zip(keys, key, strict=True))
        for c in cols:
            base = indexed[labels[0]].loc[key, c]
            for m in labels:
                row[f"{values[c]}: {m}"] = sig(indexed[m].loc[key, c])
            if c in (own_scale or []):
                continue  # each machine's own scale: side by side, not divided
            for m in labels[1:]:
                row[f"{values[c]}: {m} / {labels[0]}"] = _ratio(base, indexed[m].loc[key, c])
        rows.append(row)
    return pd.DataFrame(rows), only


def compare_stage(stage: str, dirs: dict[str, Path]) -> dict | None:
    """The comparison section of one stage, or None when no machine has its data."""
    spec = declared(stage)
    if not spec:
        return None
    parts = []
    for name, cfg in spec.items():
        read = loader(stage, name)
        frames = {m: _only(_exclude(read(d), cfg.get("exclude")), cfg.get("only"))
                  for m, d in dirs.items()}  # fmt: skip
        missing = [m for m, df in frames.items() if len(df) == 0]
        frames = {m: df for m, df in frames.items() if len(df)}
        gone = f" `{name}.csv` is missing for {', '.join(missing)}." if missing else ""
        if len(frames) < 2:
            if frames:
                parts.append({"csv": name, "note": gone.strip()})
            continue
        own = cfg.get("own_scale", [])
        keys = cfg.get("keys", [])
        same = matched({m: ok(df) for m, df in frames.items()}, keys)
        n_same = len(next(iter(same.values())).drop_duplicates(
            [k for k in keys if k in next(iter(same.values()))]
        ))  # fmt: skip
        heads = headlines_table(same, cfg.get("headlines", []), own) if n_same else pd.DataFrame()
        points, only = points_table(frames, keys, cfg.get("values", {}), own)
        n_common = len(points)
        note = (
            f"{n_common} point(s) measured on every machine here"
            + (f" (first {MAX_POINTS} shown)" if n_common >= MAX_POINTS else "")
            + "; points the others did not measure: "
            + ", ".join(f"{m} {n}" for m, n in only.items())
            + "."
            + (
                ""
                if n_same
                else " No point in common: no number of this CSV is compared (their grids "
                "differ, and a number over one grid against another's compares the grids)."
            )
            + (
                " Excluded as not the same measurement: "
                + "; ".join(", ".join(f"{k} {v}" for k, v in r.items()) for r in cfg["exclude"])
                + "."
                if cfg.get("exclude")
                else ""
            )
            + gone
        )
        parts.append(
            {
                "csv": name,
                "headlines": md_table(heads, numparse=False) if len(heads) else "",
                "points": md_table(points, numparse=False) if len(points) else "",
                "note": note,
            }
        )
    if not parts:
        return None
    return {"stage": stage, "title": report.stage_package(stage).TITLE, "parts": parts}


def render(dirs: list[Path], stages: list[str] | None = None) -> str:
    labelled: dict[str, Path] = {}
    for d in dirs:
        label = machine_label(d)
        while label in labelled:
            label += "'"
        labelled[label] = Path(d)
    stages = report.order_stages(stages or report.all_stages())
    sections = [s for s in (compare_stage(st, labelled) for st in stages) if s]
    machines = []
    for label, d in labelled.items():
        h = report.header(d)
        machines.append(
            {
                "label": label,
                "folder": str(d),
                "device": h["device_name"],
                "kind": h["kind"],
                "software": f"torch {h['torch']}, triton {h['triton']}, CUDA {h['cuda']}",
                "commit": h["git_commit"],
                "preset": h["preset"],
                "wall": f"{h['wall_minutes']:.1f} min"
                if h["wall_minutes"] == h["wall_minutes"]
                else "–",
            }
        )
    env = report.environment()
    return env.get_template("compare.md.j2").render(
        machines=machines,
        baseline=next(iter(labelled)),
        sections=sections,
        rendered=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--stages", default="", help="comma-separated; default: every stage")
    ap.add_argument("results", nargs="+", type=Path, help="results folders, baseline first")
    args = ap.parse_args(argv)
    configure("compare")
    if len(args.results) < 2:
        ap.error("give at least two results folders")
    stages = [s for s in args.stages.split(",") if s] or None
    text = render(args.results, stages)
    atomic_write_text(args.out, text)
    log.info("wrote %s comparing %s", args.out, ", ".join(str(p) for p in args.results))


if __name__ == "__main__":
    main()
