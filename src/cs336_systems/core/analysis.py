"""Helpers every stage's analysis uses: loading CSVs, markdown tables, number formatting, figures."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from cs336_systems.core.log import configure, get_logger  # noqa: E402

log = get_logger(__name__)

SIZE_ORDER = ["tiny", "small", "medium", "large", "xl", "2.7B"]


def load(results_dir: Path, name: str) -> pd.DataFrame:
    """results_dir/<name>.csv, or an empty frame when the stage has not produced it."""
    path = Path(results_dir) / f"{name}.csv"
    if not path.exists() or path.stat().st_size == 0:
        return pd.DataFrame()
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()


def ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"] == "ok"] if "status" in df else df


def size_key(series: pd.Series) -> pd.Series:
    return series.map(lambda s: SIZE_ORDER.index(s) if s in SIZE_ORDER else len(SIZE_ORDER))


def sort_sizes(df: pd.DataFrame, *more: str) -> pd.DataFrame:
    if "size" not in df:
        return df
    cols = ["size", *more]
    return df.sort_values(cols, key=lambda s: size_key(s) if s.name == "size" else s)


def fmt(x, digits: int = 2) -> str:
    """A number for prose and tables: NaN -> '–', big numbers without needless decimals."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, int | bool):
        return str(x)
    if isinstance(x, float):
        if abs(x) >= 100:
            return f"{x:,.0f}"
        return f"{x:.{digits}f}"
    return str(x)


def md_table(df: pd.DataFrame, floatfmt: int = 2) -> str:
    """A pipe table (tabulate's github format) with our number formatting."""
    if df is None or len(df) == 0:
        return "_(no rows)_"
    shown = df.copy()
    for c in shown.columns:
        shown[c] = shown[c].map(lambda v: fmt(v, floatfmt) if isinstance(v, float | int) else v)
    return shown.to_markdown(index=False)


def pct(x: float) -> str:
    return "–" if x is None or math.isnan(x) else f"{100 * x:.1f}%"


def save(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def empty_figure(path: Path, message: str) -> Path:
    """A placeholder figure that says why there is no data (the rule still has its output)."""
    fig, ax = plt.subplots(figsize=(6, 2))
    ax.axis("off")
    ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True)
    return save(fig, path)


def status_counts(df: pd.DataFrame) -> dict[str, int]:
    """Rows per status kind ("ok", "oom", "error", "skipped", ...: the text before any colon)."""
    return df["status"].map(lambda s: str(s).split(":")[0]).value_counts().to_dict()


def failed_points(df: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    if "status" not in df or len(df) == 0:
        return pd.DataFrame(columns=[*columns, "status"])
    bad = df[df["status"] != "ok"]
    return bad[[c for c in columns if c in bad] + ["status"]]


def _stage_of(plot) -> str:
    """`<stage>` of the module `cs336_systems.stages.<stage>.analysis` that defines `plot`
    (run as ``python -m``, that module is ``__main__``: its spec has the name)."""
    module = plot.__module__
    if module == "__main__":
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        module = spec.name if spec is not None else module
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "stages" else "plots"


def plot_main(plot, argv: list[str] | None = None) -> None:
    """The command line of a stage's analysis module:

    python -m cs336_systems.stages.<stage>.analysis --results results/<machine> --figures DIR
    """
    import argparse

    ap = argparse.ArgumentParser(description="Draw a stage's figures from its CSVs.")
    ap.add_argument("--results", required=True, type=Path)
    ap.add_argument("--figures", required=True, type=Path)
    args = ap.parse_args(argv)
    configure(_stage_of(plot))
    args.figures.mkdir(parents=True, exist_ok=True)
    for path in plot(args.results, args.figures):
        log.info("wrote %s", path)
