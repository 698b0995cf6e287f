"""Helpers every stage's analysis uses: loading CSVs, markdown tables, number formatting, figures."""

from __future__ import annotations

import math
import sys
from pathlib import Path

from cs336_systems.core.style import use_figure_style

use_figure_style()  # Agg, TrueType fonts in PDFs
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from cs336_systems.core.results import read_csv  # noqa: E402
from cs336_systems.planning.log import configure, get_logger  # noqa: E402
from cs336_systems.reporting import export, sanity  # noqa: E402

log = get_logger(__name__)

SIZE_ORDER = ["tiny", "small", "medium", "large", "xl", "2.7B", "10B"]
# a memory point's mode in words (the memory stage's grid; the precision section reads it too)
MEMORY_MODE_LABEL = {
    "inference": "inference forward",
    "forward": "forward (autograd on)",
    "forward_backward": "forward+backward",
    "train_step": "train step",
}


def load(results_dir: Path, name: str, derive=None) -> pd.DataFrame:
    """results_dir/<name>.csv with its `sanity` column (reporting/sanity.py: the generic checks and
    those the stages declare for this CSV), or an empty frame when the stage has not produced it.
    `derive(df)`, if given, (re)computes derived columns before the checks see them."""
    path = Path(results_dir) / f"{name}.csv"
    if not path.exists() or path.stat().st_size == 0:
        return pd.DataFrame()
    try:
        df = read_csv(path)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()
    if derive is not None and len(df):
        df = derive(df)
    return sanity.flag(df, name, results_dir=results_dir)


def ran(df: pd.DataFrame) -> pd.DataFrame:
    """Rows whose point ran (status ok), suspect ones included: for tables that show every
    measured point with its flag."""
    return df[df["status"] == "ok"] if "status" in df else df


def ok(df: pd.DataFrame, scope: str | None = None) -> pd.DataFrame:
    """Rows a sentence, summary or figure may rest on: ran, and passed the sanity checks (with
    `scope`, e.g. 'memory': the checks that doubt numbers of that kind; reporting/sanity.py)."""
    r = ran(df)
    return r[~sanity.is_suspect(r, scope)]


def plural(n: int, noun: str) -> str:
    """'1 point', '3 points' (`noun` singular; an s is added unless n is 1)."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def status_summary(statuses: dict) -> str:
    """'39 ok, 6 skipped': a section's points per kind of status (the text before ':'), `ok`
    first; each reason is in the section's table of the points that did not run."""
    kinds: dict[str, int] = {}
    for status, n in statuses.items():
        kind = str(status).split(":", 1)[0].strip()
        kinds[kind] = kinds.get(kind, 0) + int(n)
    order = sorted(kinds, key=lambda k: (k != "ok", -kinds[k]))
    return ", ".join(f"{kinds[k]} {k}" for k in order)


def mark_suspect(text: str, suspect: bool) -> str:
    """A table cell of a suspect point: its value with the flag."""
    return f"{text} ⚠ suspect" if suspect else text


def size_key(series: pd.Series) -> pd.Series:
    return series.map(lambda s: SIZE_ORDER.index(s) if s in SIZE_ORDER else len(SIZE_ORDER))


def ordered_sizes(values) -> list[str]:
    """Distinct size names in size order (unknown names after the known ones, by name)."""
    known = {s: i for i, s in enumerate(SIZE_ORDER)}
    return sorted(set(values), key=lambda s: (known.get(s, len(known)), str(s)))


def sort_sizes(df: pd.DataFrame, *more: str) -> pd.DataFrame:
    if "size" not in df:
        return df
    cols = ["size", *more]
    return df.sort_values(cols, key=lambda s: size_key(s) if s.name == "size" else s)


def own_model_words(row) -> str:
    """An own model's row (docs/own-model.md) in words: its name, factory, parameters and
    where its FLOPs come from; empty for a course size's row."""
    factory = row.get("own_model")
    if not isinstance(factory, str):
        return ""
    said = [f"`{factory}`"]
    if pd.notna(row.get("params")):
        said.append(f"{sig(float(row['params']) / 1e6)} M parameters")
    if isinstance(row.get("flops_source"), str):
        said.append(f"FLOPs {row['flops_source']}")
    return f"own model **{row['size']}** ({', '.join(said)})"


def own_model_note(df: pd.DataFrame, what: str) -> str:
    """A section's sentence on the own model in its rows: `own_model_words`, then `what` the
    stage did with it; empty where no row names one."""
    if "own_model" not in df or not df["own_model"].notna().any():
        return ""
    words = own_model_words(df[df["own_model"].notna()].iloc[0])
    return f"{words[0].upper()}{words[1:]}: {what}"


def faster_or_slower(ratio: float, num=lambda v: f"{v:.2f}") -> str:
    """A speed-up (old time over new) the way it goes: "1.25× faster", or "1.37× slower" for a
    ratio of 0.73; `num` prints the number."""
    return f"{num(ratio)}× faster" if ratio >= 1 else f"{num(1 / ratio)}× slower"


def fmt(x, digits: int = 2) -> str:
    """A number for prose and tables: NaN -> '–', big numbers without needless decimals, small
    ones with at least two significant digits (0.00087, not 0.00)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, int | bool):
        return str(x)
    if isinstance(x, float):
        if abs(x) >= 100:
            return f"{x:,.0f}"
        if x == 0 or math.isinf(x):
            return f"{x:.{digits}f}"
        decimals = max(digits, 1 - math.floor(math.log10(abs(x))))
        return f"{x:.{min(decimals, 12)}f}"
    return str(x)


def sig(x, digits: int = 3) -> str:
    """A rate or size with `digits` significant digits whatever its magnitude (723, 52.0,
    0.0865, 0.00087; thousands separated): for numbers that span orders of magnitude, such as
    one machine's ceilings beside another's."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    x = float(x)
    if x == 0 or math.isinf(x):
        return f"{x:g}"
    exp = math.floor(math.log10(abs(x)))
    if exp >= digits - 1:
        return f"{x:,.0f}"
    return f"{x:.{digits - 1 - exp}f}"


def mib(x, digits: int = 3) -> str:
    """A size counted in MiB (2^20 bytes: every `_mb` column) as text with its binary unit:
    "812 MiB", from 1,024 MiB on "1.50 GiB" (`sig` digits); never "MB" or "GB", which are
    10^6 and 10^9 bytes."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    x = float(x)
    return f"{sig(x / 1024, digits)} GiB" if abs(x) >= 1024 else f"{sig(x, digits)} MiB"


def _number_or_blank(v) -> bool | None:
    """True: a cell that reads as a number ('0.200', '1,039', '2.5e-06'); None: an empty one;
    False: text (a '–', a '%', a '⚠' make a cell text, as tabulate has it)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    text = str(v).strip()
    if not text:
        return None
    try:
        float(text.replace(",", ""))
    except ValueError:
        return False
    return True


def _numeric_column(col: pd.Series) -> bool:
    """Right-aligned, as tabulate aligns a column it parses as numbers: every cell a number or
    empty, at least one a number."""
    kinds = [_number_or_blank(v) for v in col]
    return False not in kinds and True in kinds


def _integral(col: pd.Series) -> bool:
    """Every value of a float column a whole number (a count stored as float beside a NaN)."""
    v = pd.to_numeric(col, errors="coerce").dropna()
    return (
        col.dtype.kind == "f"
        and len(v) > 0
        and bool((v == v.round()).all())
        and v.abs().max() < 1e15
    )


_BINARY_SUFFIX = {"_mb": "MiB", "_mib": "MiB", "_gib": "GiB"}


def unit_header(column):
    """A column's header with its unit as written: `params_mb` (2^20 bytes, core/costs.py) is
    "params (MiB)", `need_gib` "need (GiB)"; other columns as they are."""
    for suffix, unit in _BINARY_SUFFIX.items():
        if isinstance(column, str) and column.endswith(suffix) and len(column) > len(suffix):
            return f"{column.removesuffix(suffix)} ({unit})"
    return column


def md_table(df: pd.DataFrame, floatfmt: int = 2, numparse: bool = True) -> str:
    """A pipe table (tabulate's github format) with our number formatting: each cell as `fmt`
    (or the caller) wrote it, never re-parsed (tabulate would print 0.200 as 0.2 beside 0.337,
    4.300 as 4.3), a column of numbers right-aligned as tabulate aligns it; a float column of
    whole numbers (counts beside a NaN) without decimals; a `_mb` column's header says MiB
    (`unit_header`). `numparse=False`: every column is text, left-aligned (versions such as
    13.0)."""
    if df is None or len(df) == 0:
        return "_(no rows)_"
    shown = df.copy()
    for c in shown.columns:
        if _integral(df[c]):
            shown[c] = shown[c].map(lambda v: "–" if math.isnan(v) else f"{v:,.0f}")
        else:
            shown[c] = shown[c].map(lambda v: fmt(v, floatfmt) if isinstance(v, float | int) else v)
    shown = shown.rename(columns=unit_header)
    if not numparse:
        align = ["left"] * len(shown.columns)
        text = shown.to_markdown(index=False, disable_numparse=True)
    else:
        align = ["right" if _numeric_column(shown[c]) else "left" for c in shown.columns]
        text = shown.to_markdown(index=False, disable_numparse=True, colalign=align)
    export.record(text, shown, align)  # the write-up's LaTeX and Typst copies (reporting/export.py)
    return text


def pct(x: float) -> str:
    return "–" if x is None or math.isnan(x) else f"{100 * x:.1f}%"


def save(fig, path: Path, tight: bool = True, metadata: dict | None = None) -> Path:
    """The figure as `path` (PNG, for the report) and beside it as PDF (vector, for a write-up:
    LaTeX's \\includegraphics, Typst's image); returns the PNG's path. `tight=False`: the
    caller laid the figure out itself; `metadata`: the PNG's text chunks (a placeholder says
    so there, `empty_figure`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if tight:
        fig.tight_layout()
    fig.savefig(path, dpi=110, metadata=metadata)
    # no creation date: the same figure is the same file
    fig.savefig(path.with_suffix(".pdf"), metadata={"CreationDate": None})
    plt.close(fig)
    return path


def stacked_bars(
    ax, labels, frame: pd.DataFrame, parts, fill: float | None = None, horizontal: bool = False
) -> None:
    """One bar per label, `frame`'s columns stacked in the order of `parts` ((column, legend
    label) pairs); with `fill`, a missing value counts as it. `horizontal`: bars along x, the
    labels down the y axis, first at the top (long labels stay readable side by side)."""
    bottom = np.zeros(len(frame))
    for col, name in parts:
        vals = frame[col] if fill is None else frame[col].fillna(fill)
        vals = vals.to_numpy()
        if horizontal:
            ax.barh(labels, vals, left=bottom, label=name)
        else:
            ax.bar(labels, vals, bottom=bottom, label=name)
        bottom += vals
    if horizontal and not ax.yaxis_inverted():
        ax.invert_yaxis()


# a placeholder PNG says so in its metadata: the report names the reason instead of showing it
PLACEHOLDER = "cs336 placeholder: "


def empty_figure(path: Path, message: str) -> Path:
    """A placeholder figure that says why there is no data (the rule still has its output); the
    report shows the reason in words instead of embedding it (`placeholder_reason`)."""
    fig, ax = plt.subplots(figsize=(6, 2))
    ax.axis("off")
    ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True)
    return save(fig, path, metadata={"Description": PLACEHOLDER + message})


def placeholder_reason(path: Path) -> str | None:
    """The message of a placeholder figure (`empty_figure`), None for a real one or no file."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            text = im.info.get("Description", "")
    except (OSError, ValueError):
        return None
    return text.removeprefix(PLACEHOLDER) if text.startswith(PLACEHOLDER) else None


def on_axis(keys, values, axis) -> np.ndarray:
    """`values` placed at their keys' positions on `axis`, NaN where a key of the axis has no
    value: a line drawn through it breaks at a missing point instead of bridging it."""
    out = np.full(len(axis), np.nan)
    pos = {k: i for i, k in enumerate(axis)}
    for k, v in zip(keys, values, strict=True):
        out[pos[k]] = v
    return out


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


# ---- the all-reduce's latency-bandwidth fit (the allreduce and ddp sections read it) ---------

# one all-reduce configuration: the points a latency-bandwidth fit runs over
ALLREDUCE_GROUP = ["backend", "buffers", "world_size"]


def fit_latency_bandwidth(df: pd.DataFrame) -> pd.DataFrame:
    """Fit t(bytes) = o + bytes / w per (backend, buffers, world size) to the median times.

    Least squares on relative error (each point weighted by 1/t), so the small messages fix
    the latency o and the large ones the bandwidth w; o is clipped at 0. w is an algorithmic
    bandwidth (bytes of the message per second), as the bucket-size model wants it. A row
    flagged suspect is left out; `points` counts the rows fitted, `suspect`
    those left out.
    """
    rows = []
    if len(df) and "buffers" not in df:
        df = df.assign(buffers="default")
    ran = df[df["status"] == "ok"]
    out = sanity.is_suspect(ran)
    d = ran[~out]
    n_out = ran[out].groupby(ALLREDUCE_GROUP).size().to_dict() if out.any() else {}
    for key, g in d.groupby(ALLREDUCE_GROUP):
        g = g[g["time_ms_median"] > 0]
        if len(g) < 2:
            continue
        t = g["time_ms_median"].to_numpy() * 1e-3
        b = g["bytes"].to_numpy(dtype=float)
        a = np.stack([1 / t, b / t], axis=1)
        (o, inv_w), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
        clipped = bool(o < 0 or inv_w <= 0)
        if clipped:
            o, inv_w = 0.0, float(np.mean(t / b))
        pred = o + b * inv_w
        row = {
            **dict(zip(ALLREDUCE_GROUP, key, strict=True)),
            "latency_us": o * 1e6,
            "bandwidth_gbps": 1 / inv_w / 1e9,
            "max_rel_residual": float(np.max(np.abs(pred - t) / t)),
            "points": len(g),
            "suspect": int(n_out.get(key, 0)),
            "clipped": clipped,
            "min_time_us": float(t.min() * 1e6),
        }
        row["problem"] = fit_problem(
            row["latency_us"],
            row["bandwidth_gbps"],
            row["max_rel_residual"],
            row["min_time_us"],
            clipped,
        )
        rows.append(row)
    return pd.DataFrame(rows)


# no collective call costs less than this (µs): a GPU kernel launch alone takes a few, a gloo
# call tens; a fitted per-call cost below it is an artefact of the fit, not a cost
MIN_CALL_US = 1.0
# a latency-bandwidth fit with a point further off than this (relative) does not describe its
# curve
MAX_FIT_RESIDUAL = 0.5


def fit_problem(
    latency_us: float,
    bandwidth_gbps: float,
    max_rel_residual: float = float("nan"),
    min_time_us: float = float("nan"),
    clipped: bool = False,
) -> str:
    """Why a latency-bandwidth fit (t = o + bytes / w) cannot be quoted as a finding, or '' when
    its parameters are physical: a negative per-call cost (clipped to 0), a per-call cost below
    `MIN_CALL_US`, or above the fastest measured call of the curve (`min_time_us`: one call
    cannot cost more than a whole call took), no positive bandwidth, or a poor fit (a point off
    by more than `MAX_FIT_RESIDUAL`)."""
    if clipped or latency_us < 0:
        return "the least-squares per-call cost is negative (clipped to 0)"
    if not np.isfinite(bandwidth_gbps) or bandwidth_gbps <= 0:
        return "no positive bandwidth"
    if latency_us < MIN_CALL_US:
        return (
            f"a per-call cost of {fmt(latency_us)} µs is below {MIN_CALL_US:g} µs, less than "
            f"launching one kernel"
        )
    if np.isfinite(min_time_us) and latency_us > min_time_us:
        return (
            f"a per-call cost of {fmt(latency_us)} µs is above the fastest measured call "
            f"({fmt(min_time_us)} µs)"
        )
    if np.isfinite(max_rel_residual) and max_rel_residual > MAX_FIT_RESIDUAL:
        return f"a poor fit: a point is off by {max_rel_residual:.0%}"
    return ""
