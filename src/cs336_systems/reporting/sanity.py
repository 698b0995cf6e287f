"""Sanity checks: a number that cannot be right is flagged `suspect: <why>`, never quoted as a finding.

Every stage CSV read through `reporting.analysis.load` gets a `sanity` column: empty where the row
passed every check, `suspect: <why>[; <why>...]` where it did not. `reporting.analysis.ok` leaves
suspect rows out (with failed ones), so sentences, summaries and figures never rest on them;
`ran` keeps them for tables that show every measured point with its flag, and the report lists
each section's suspect rows with their reasons (`collecting`, `suspect_table`).

A check doubts one kind of number (`SCOPES`: times, rates, memory, or all of a row's), recorded
in `sanity_scope`: `ok(df, scope="memory")` keeps a row whose times are noisy for a sentence
about its memory.

Checks are data. The generic ones below apply to every CSV by its columns (a std above its mean,
a negative time, size or rate, an MFU above 100%, a forward or a backward timed alone slower than
the forward+backward of the same row). One check discloses rather than doubts: a host-sensitive
row measured while other jobs ran gets their names in `measured_beside`, listed with the suspect
rows but kept in sentences (each job has its own cards and cores: planning/cores.py). A stage adds its own, or re-parametrizes a
generic one, by declaring ``SANITY = {"<csv name>": [{"kind": ..., ...}, ...]}`` in its
package's ``__init__.py`` (plain literals: it is read with `ast.literal_eval`, not imported, so
that a stage's declarations hold wherever its CSV is read, also by another stage's analysis).
The kinds are the functions of `KINDS`; a declared check with a generic check's kind replaces
the generic one for that CSV.
"""

from __future__ import annotations

import ast
import contextlib
import math
import re
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd

from cs336_systems.core.costs import MODEL_PATH, PATH_LABEL, matmul_peaks
from cs336_systems.core.results import COLUMN, PREFIX, SCOPE_COLUMN, is_suspect, text_column
from cs336_systems.planning import neighbours
from cs336_systems.reporting.host_bound import POINT, host_bound

# what kind of number a check doubts: a sentence about memory need not drop a row whose times
# are noisy. A check's default scope, overridable by a declaration's "scope".
SCOPES = ("time", "rate", "memory", "all")
DEFAULT_SCOPE = {
    "std_above_mean": "time",
    "negative_value": "all",
    "mfu_above_one": "rate",
    "part_slower_than_whole": "time",
    "less_work_slower": "time",
    "ceiling_path": "rate",
    "greater_than": "all",
    "rate_above_ceiling": "rate",
    "pass_slower_than_total": "time",
    "beside_others": "time",
}
STAGES_DIR = Path(__file__).resolve().parents[1] / "stages"
# the measuring jobs' records under a results folder (planning/neighbours.py), and the column
# that names a host-sensitive row's neighbours: shown beside the suspect rows, not left out
RECORDS = Path("jobs") / "records"
BESIDE = "measured_beside"

# columns that name a measured point, in the order a reader looks for them
POINT_KEYS = [
    "point",
    "size",
    "context_length",
    "mode",
    "precision",
    "compile",
    "attention",
    "impl",
    "grid",
    "dtype",
    "d_head",
    "seq_len",
    "heads",
    "kind",
    "path",
    "backend",
    "buffers",
    "world_size",
    "size_mb",
    "variant",
    "bucket_mb",
    "warmup_steps",
    "case",
    "device",
]


def _blank(df: pd.DataFrame) -> pd.Series:
    return pd.Series("", index=df.index, dtype=object)


def _checked(df: pd.DataFrame) -> pd.Series:
    """Rows a check looks at: those that ran (a failed row has no numbers to doubt)."""
    if "status" not in df:
        return pd.Series(True, index=df.index)
    return df["status"].astype(str) == "ok"


def _skip(df: pd.DataFrame, skip_if: dict | None) -> pd.Series:
    """Rows a declaration exempts: every (column, value) of `skip_if` matches."""
    mask = pd.Series(False, index=df.index)
    if not skip_if:
        return mask
    mask = pd.Series(True, index=df.index)
    for col, value in skip_if.items():
        if col not in df:
            return pd.Series(False, index=df.index)
        mask &= df[col] == value
    return mask


def _num(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "nan"
    ax = abs(x)
    if ax >= 100:
        return f"{x:,.0f}"
    if ax == 0:
        return "0"
    return f"{x:.{max(0, 2 - int(math.floor(math.log10(ax))))}f}"


# --------------------------------------------------------------------------------- check kinds


def std_above_mean(
    df: pd.DataFrame, skip_if: dict | None = None, columns: str | None = None, **_
) -> pd.Series:
    """A time's sample std above its mean: one outlier dominates, the mean describes nothing.
    `columns`: a regular expression the std columns checked must match (default: all)."""
    out = _blank(df)
    rows = _checked(df) & ~_skip(df, skip_if)
    stds = [c for c in df.columns if c.endswith("_std")]
    if columns is not None:
        stds = [c for c in stds if re.search(columns, c)]
    for std in stds:
        mean = std[: -len("_std")] + "_mean"
        if mean not in df:
            continue
        s, m = pd.to_numeric(df[std], errors="coerce"), pd.to_numeric(df[mean], errors="coerce")
        bad = rows & (s > m) & (m > 0)
        for i in df.index[bad]:
            out[i] = _join(out[i], f"{std} {_num(s[i])} above {mean} {_num(m[i])}")
    return out


_NONNEGATIVE = re.compile(r"(_ms(_\w+)?|_mb|_tflops|tflops|_gbps|_per_s|mfu|_bytes)$")


def negative_value(df: pd.DataFrame, skip_if: dict | None = None, **_) -> pd.Series:
    """A negative or infinite time, size, rate or MFU: no measurement gives one. A change
    (`*_change_*`: what a phase adds to allocated memory, say) may be negative; only an infinite
    one is doubted."""
    out = _blank(df)
    rows = _checked(df) & ~_skip(df, skip_if)
    for col in [c for c in df.columns if _NONNEGATIVE.search(c)]:
        signed = "_change_" in col
        v = pd.to_numeric(df[col], errors="coerce")
        if v.isna().all():
            continue
        bad = rows & (np.isinf(v) if signed else (v < 0) | np.isinf(v))
        for i in df.index[bad]:
            out[i] = _join(out[i], f"{col} is {_num(v[i])}")
    return out


def _pct_above(x: float) -> str:
    """A fraction above 1 as a percentage with the digits that show it above 100% (108%,
    100.2%, 100.004%)."""
    for digits in range(7):
        text = f"{100 * x:.{digits}f}"
        if float(text) > 100:
            return f"{text}%"
    return f"{100 * x!r}%"


def mfu_above_one(df: pd.DataFrame, column: str = "mfu", skip_if: dict | None = None, **_):
    """MFU above 100%: the point ran faster than the machine's measured peak."""
    out = _blank(df)
    if column not in df:
        return out
    v = pd.to_numeric(df[column], errors="coerce")
    bad = _checked(df) & ~_skip(df, skip_if) & (v > 1)
    for i in df.index[bad]:
        peak = df.at[i, "peak_tflops"] if "peak_tflops" in df else float("nan")
        rate = df.at[i, "tflops"] if "tflops" in df else float("nan")
        out[i] = (
            f"MFU {_pct_above(v[i])} is above 100% ({_num(rate)} TFLOP/s against a measured "
            f"peak of {_num(peak)})"
        )
    return out


def part_slower_than_whole(
    df: pd.DataFrame,
    by: str,
    part: str,
    whole: str,
    value: str,
    keys: list[str],
    what: str | None = None,
    **_,
) -> pd.Series:
    """A part of a step (rows with `by` == part) slower than the whole step it belongs to (rows
    with `by` == whole, same `keys`): both rows are flagged, one of them cannot be right."""
    out = _blank(df)
    keys = [k for k in keys if k in df]
    if by not in df or value not in df:
        return out
    rows = df[_checked(df)]
    a = rows[rows[by] == part]
    b = rows[rows[by] == whole]
    if a.empty or b.empty:
        return out
    whole_at = {tuple(r[keys]): (i, r[value]) for i, r in b.iterrows()}
    label = what or f"{part} slower than {whole}"
    for i, r in a.iterrows():
        hit = whole_at.get(tuple(r[keys]))
        if hit is None or not (r[value] > hit[1]):
            continue
        text = f"{label}: {_num(r[value])} > {_num(hit[1])} ms ({value})"
        text += _noise(r[value] - hit[1], r, b.loc[hit[0]], value)
        out[i] = _join(out[i], text)
        out[hit[0]] = _join(out[hit[0]], text)
    return out


def less_work_slower(
    df: pd.DataFrame,
    value: str,
    keys: list[str],
    order: str = "flops_per_step",
    tolerance: float = 0.05,
    what: str = "slower than a point of more work",
    **_,
) -> pd.Series:
    """A point slower (beyond `tolerance`) than a point of more work (`order`) at the same
    `keys`, e.g. a model slower than a larger one at the same context, mode and precision: its
    time is not its own work's (the host or a neighbour held it). The point of less work is
    flagged, naming the fastest of the larger ones."""
    out = _blank(df)
    keys = [k for k in keys if k in df]
    if value not in df or order not in df:
        return out
    rows = df[_checked(df)].dropna(subset=[value, order])
    for _, g in rows.groupby(keys, dropna=False) if keys else [((), rows)]:
        for i, r in g.iterrows():
            more = g[(g[order] > r[order]) & (r[value] > g[value] * (1 + tolerance))]
            if more.empty:
                continue
            j = more[value].idxmin()
            name = f"`{more.loc[j, 'size']}`" if "size" in more else "it"
            text = f"{what} ({name}): {_num(r[value])} > {_num(more.loc[j, value])} ms ({value})"
            out[i] = _join(out[i], text)
    return out


def _noise(gap: float, a: pd.Series, b: pd.Series, a_col: str, b_col: str | None = None) -> str:
    """How a gap between two timings compares with their spread, where the rows record one
    (`<name>_std` beside `<name>_mean` or `_median`): the reader's first question about a part
    slower than its whole. '' without a spread."""
    stds = []
    for row, col in ((a, a_col), (b, b_col or a_col)):
        base = col.rsplit("_", 1)[0]
        std = pd.to_numeric(row.get(f"{base}_std"), errors="coerce")
        if not col.endswith(("_mean", "_median")) or not std == std:
            return ""
        stds.append(float(std))
    side = "within" if gap <= max(stds) else "larger than"
    return (
        f"; the gap, {_num(gap)} ms, is {side} the step-to-step std of the two"
        f" ({_num(stds[0])} and {_num(stds[1])} ms)"
    )


PASS_LABEL = {"fwd": "forward", "bwd": "backward", "fwd_bwd": "forward+backward"}


def pass_slower_than_total(
    df: pd.DataFrame,
    total: str = "fwd_bwd",
    parts: tuple[str, ...] | list[str] = ("fwd", "bwd"),
    stats: tuple[str, ...] | list[str] = ("median", "mean"),
    skip_if: dict | None = None,
    **_,
) -> pd.Series:
    """A pass timed alone (`<part>_ms_<stat>`) slower than the passes it is part of, timed
    together in the same row (`<total>_ms_<stat>`): a backward above its forward+backward cannot
    be right. Compared on the first of `stats` both columns have (the median the reports quote;
    a mean one outlier pulled up is std_above_mean's to flag)."""
    out = _blank(df)
    rows = _checked(df) & ~_skip(df, skip_if)
    for part in parts:
        stat = next((s for s in stats if f"{part}_ms_{s}" in df and f"{total}_ms_{s}" in df), None)
        if stat is None:
            continue
        a_col, b_col = f"{part}_ms_{stat}", f"{total}_ms_{stat}"
        a = pd.to_numeric(df[a_col], errors="coerce")
        b = pd.to_numeric(df[b_col], errors="coerce")
        label = f"{PASS_LABEL.get(part, part)} slower than {PASS_LABEL.get(total, total)}"
        for i in df.index[rows & (a > b)]:
            text = f"{label}: {_num(a[i])} > {_num(b[i])} ms ({a_col}, {b_col})"
            r = df.loc[i]
            text += _noise(a[i] - b[i], r, r, a_col, b_col)
            out[i] = _join(out[i], text)
    return out


def ceiling_path(
    df: pd.DataFrame,
    precision: str = "precision",
    path: str = "peak_path",
    expected: dict | None = None,
    **_,
) -> pd.Series:
    """An MFU taken against a ceiling measured through a path the model does not use (e.g. a
    plain bf16 matmul for a model that runs bf16 as autocast F.linear on fp32 weights). CSVs
    from before the path was recorded measured plain matmuls only."""
    out = _blank(df)
    expected = expected or MODEL_PATH
    if "mfu" not in df or precision not in df:
        return out
    used = df[path] if path in df else pd.Series("matmul", index=df.index)
    has = pd.to_numeric(df["mfu"], errors="coerce").notna()
    own = df["matmul_path"] if "matmul_path" in df else pd.Series(index=df.index, dtype=object)
    for i in df.index[_checked(df) & has]:
        # a row naming its own matmul path (the engine's bf16 working weights) runs that one
        mine = own[i]
        want = mine if isinstance(mine, str) and mine else expected.get(str(df.at[i, precision]))
        got = str(used[i])
        if want is not None and got != want:
            out[i] = (
                f"MFU against a {df.at[i, precision]} ceiling measured through "
                f"{PATH_LABEL.get(got, got)}; the model runs {PATH_LABEL.get(want, want)}"
            )
    return out


def greater_than(
    df: pd.DataFrame,
    left: str,
    right: str,
    why: str,
    tolerance: float = 0.0,
    skip_if: dict | None = None,
    **_,
) -> pd.Series:
    """`left` above `right` (times 1 + tolerance) where that cannot happen."""
    out = _blank(df)
    if left not in df or right not in df:
        return out
    a, b = pd.to_numeric(df[left], errors="coerce"), pd.to_numeric(df[right], errors="coerce")
    bad = _checked(df) & ~_skip(df, skip_if) & (a > b * (1 + tolerance))
    for i in df.index[bad]:
        out[i] = f"{why} ({left} {_num(a[i])} > {right} {_num(b[i])})"
    return out


def rate_above_ceiling(
    df: pd.DataFrame,
    rates: list[str],
    dtype: str = "dtype",
    ceilings: pd.DataFrame | None = None,
    fp32_precision: str = "fp32_matmul_precision",
    fraction: float = 1.0,
    why: str = "",
    **_,
) -> pd.Series:
    """A TFLOP/s above `fraction` of this machine's measured matmul peak for the row's dtype
    (plain matmul: the path tensors of that dtype take; fp32 at `high` precision runs as TF32);
    `why` follows the numbers in the reason (below 1, a rate too near the peak to believe
    without measuring it again)."""
    out = _blank(df)
    peaks = matmul_peaks(ceilings)
    if not peaks or dtype not in df:
        return out
    for i in df.index[_checked(df)]:
        dt = str(df.at[i, dtype])
        if dt == "fp32" and str(df.get(fp32_precision, pd.Series("", index=df.index))[i]) in (
            "high",
            "medium",
        ):
            dt = "tf32"
        peak = peaks.get(dt)
        if peak is None:
            continue
        for col in [c for c in rates if c in df]:
            v = pd.to_numeric(pd.Series([df.at[i, col]]), errors="coerce").iloc[0]
            if v == v and v > fraction * peak:
                where = "above" if v > peak else f"{v / peak:.0%} of"
                text = f"{col} {_num(v)} {where} the measured {dt} matmul peak {_num(peak)}"
                out[i] = _join(out[i], text + (f": {why}" if why else ""))
    return out


def _rule_host_bound(df: pd.DataFrame) -> dict[tuple, float]:
    """The points the one host-bound rule (reporting/host_bound.py) fires on, by their `POINT`
    keys present in `df`: bf16's speedup over fp32 at each."""
    need = {"precision", "peak_tflops", "step_ms_mean"}
    keys = [k for k in POINT if k in df]
    if not need <= set(df) or not keys:
        return {}
    d = df.assign(step_ms_mean=pd.to_numeric(df["step_ms_mean"], errors="coerce"),
                  peak_tflops=pd.to_numeric(df["peak_tflops"], errors="coerce"))  # fmt: skip
    hb = host_bound(d)
    return {tuple(r[k] for k in keys): float(r["speedup"]) for _, r in hb.iterrows()}


def _host_sensitive(
    row: pd.Series, busy_below: float, spread_above: float, rule: dict | None = None
) -> str:
    """Why a row's number depends on its host's CPU: timed on the CPU, a GPU idle for part of
    the step, a point the host-bound rule fires on (`rule`: `_rule_host_bound`'s), or a wide
    spread; '' when none holds."""
    if pd.to_numeric(row.get("gpu_count"), errors="coerce") == 0:
        return "timed on the CPU"
    point = tuple(row.get(k) for k in POINT if k in row.index)
    if rule and point in rule:
        return f"host-bound: bf16 {rule[point]:.2f}x as fast as fp32 at this point"
    busy, step = row.get("prof_gpu_busy_ms"), row.get("prof_step_ms")
    if pd.notna(busy) and pd.notna(step) and float(step) > 0 and busy / step < busy_below:
        return f"host-bound: its GPU busy {busy / step:.0%} of the step"
    for std in [c for c in row.index if c.endswith("_std")]:
        mean = row.get(std[: -len("_std")] + "_mean")
        s, m = pd.to_numeric(row[std], errors="coerce"), pd.to_numeric(mean, errors="coerce")
        if pd.notna(s) and pd.notna(m) and m > 0 and s / m > spread_above:
            return f"spread: {std} {s / m:.0%} of its mean"
    return ""


def beside_others(
    df: pd.DataFrame,
    records: dict | None = None,
    busy_below: float = 0.9,
    spread_above: float = 0.03,
    skip_if: dict | None = None,
    **_,
) -> pd.Series:
    """A host-sensitive row (`_host_sensitive`) whose job ran while other measuring jobs did:
    their names (the job records, planning/neighbours.py) and why the row is sensitive."""
    out = _blank(df)
    if not records or "job_id" not in df:
        return out
    rule = _rule_host_bound(df)
    for i in df.index[_checked(df) & ~_skip(df, skip_if)]:
        near = neighbours.neighbours(records, str(df.at[i, "job_id"]))
        why = _host_sensitive(df.loc[i], busy_below, spread_above, rule) if near else ""
        if why:
            out[i] = f"measured beside {', '.join(near)} ({why})"
    return out


KINDS: dict[str, Callable[..., pd.Series]] = {
    "std_above_mean": std_above_mean,
    "negative_value": negative_value,
    "mfu_above_one": mfu_above_one,
    "part_slower_than_whole": part_slower_than_whole,
    "less_work_slower": less_work_slower,
    "ceiling_path": ceiling_path,
    "greater_than": greater_than,
    "rate_above_ceiling": rate_above_ceiling,
    "pass_slower_than_total": pass_slower_than_total,
    "beside_others": beside_others,
}
GENERIC = (
    {"kind": "beside_others"},
    {"kind": "std_above_mean"},
    {"kind": "negative_value"},
    {"kind": "mfu_above_one"},
    {"kind": "pass_slower_than_total"},
)


# ------------------------------------------------------------------------------- declarations


def _literal_assignment(path: Path, name: str):
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return ast.literal_eval(node.value)
    return None


@cache
def declared(stages_dir: Path = STAGES_DIR) -> dict[str, tuple[dict, ...]]:
    """{csv name: checks} from every stage package's `SANITY` literal."""
    out: dict[str, list[dict]] = {}
    for init in sorted(Path(stages_dir).glob("*/__init__.py")):
        for name, checks in (_literal_assignment(init, "SANITY") or {}).items():
            out.setdefault(name, []).extend(checks)
    return {k: tuple(v) for k, v in out.items()}


def checks_for(name: str, extra: tuple[dict, ...] | list[dict] = ()) -> list[dict]:
    """The generic checks, replaced or extended by what the stages declare for `name`."""
    own = [*declared().get(name, ()), *extra]
    kinds = {c["kind"] for c in own}
    return [*(c for c in GENERIC if c["kind"] not in kinds), *own]


# -------------------------------------------------------------------------------------- flags


def _join(a: str, b: str) -> str:
    if not a:
        return b
    return a if b in a.split("; ") else f"{a}; {b}"


def _existing(df: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """(reasons, scopes) already recorded; a reason recorded without its scope doubts all."""
    if COLUMN not in df:
        return _blank(df), _blank(df)
    reasons = text_column(df[COLUMN]).str.removeprefix(PREFIX)
    if SCOPE_COLUMN in df:
        scopes = text_column(df[SCOPE_COLUMN])
    else:
        scopes = reasons.map(lambda r: "all" if r else "")
    return reasons, scopes


def flag(
    df: pd.DataFrame,
    name: str | None = None,
    checks: list[dict] | None = None,
    ceilings: pd.DataFrame | None = None,
    results_dir: Path | None = None,
) -> pd.DataFrame:
    """`df` with its `sanity` column (re)computed: the reasons already recorded (an aggregate
    wrote them) plus those of `checks` (default: `checks_for(name)`). A check against the
    machine's ceilings reads them from `ceilings`, else from `results_dir`/ceilings.csv."""
    if df is None or len(df) == 0:
        return df
    checks = checks if checks is not None else checks_for(name or "")
    if ceilings is None and results_dir is not None:
        path = Path(results_dir) / "ceilings.csv"
        if any(c["kind"] == "rate_above_ceiling" for c in checks) and path.exists():
            with contextlib.suppress(pd.errors.EmptyDataError):
                ceilings = pd.read_csv(path)
    reasons, scopes = _existing(df)
    beside = _blank(df)
    for spec in checks:
        fn = KINDS[spec["kind"]]
        params = {k: v for k, v in spec.items() if k not in ("kind", "scope")}
        scope = spec.get("scope", DEFAULT_SCOPE[spec["kind"]])
        if spec["kind"] == "rate_above_ceiling":
            params.setdefault("ceilings", ceilings)
        if spec["kind"] == "beside_others":  # disclosed, not doubted: its own column
            if results_dir is not None:
                params.setdefault("records", neighbours.read(Path(results_dir) / RECORDS))
            beside = fn(df, **params)
            continue
        found = fn(df, **params)
        for i in df.index[found != ""]:
            for why in str(found[i]).split("; "):
                reasons[i] = _join(reasons[i], why)
            scopes[i] = ";".join(sorted({*filter(None, scopes[i].split(";")), scope}))
    df = df.copy()
    df[COLUMN] = [PREFIX + r if r else "" for r in reasons]
    df[SCOPE_COLUMN] = list(scopes)
    df[BESIDE] = list(beside)
    _record(name, df)
    return df


def n_suspect(df: pd.DataFrame) -> int:
    return int(is_suspect(df).sum()) if len(df) else 0


def excluded(n: int, what: str = "point") -> str:
    """' (2 suspect points excluded)' or ''."""
    if not n:
        return ""
    return f" ({n} suspect {what}{'' if n == 1 else 's'} excluded: see Suspect numbers)"


def missing_answer(suspect: list[str], failed: str, joiner: str = " and ") -> str:
    """What a question says when the runs it needs have no sentence: the `suspect` runs (names)
    failed a sanity check, or, with none, `failed` (why they did not succeed); in italics."""
    if not suspect:
        return f"_{failed}_"
    many = len(suspect) > 1
    return (
        f"_The {joiner.join(suspect)} run{'s' if many else ''} failed a sanity check (see Suspect "
        f"numbers), so no sentence here rests on {'them' if many else 'it'}._"
    )


def point_label(row: pd.Series, keys: list[str] | None = None) -> str:
    """The point a row measured, by the `keys` (default: every POINT_KEYS column it has)."""
    parts = []
    for k in keys if keys is not None else POINT_KEYS:
        if k in row and not (isinstance(row[k], float) and math.isnan(row[k])):
            v = row[k]
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            parts.append(str(v) if k in ("point", "size", "mode", "impl") else f"{k} {v}")
    return ", ".join(parts) or "–"


def _why(row: pd.Series) -> str:
    why = str(row.get(COLUMN) or "").removeprefix(PREFIX)
    beside = str(row.get(BESIDE) or "")
    if beside and beside != "nan":
        why = _join(why, f"kept, but {beside}" if not why else beside)
    return why


def suspect_rows(df: pd.DataFrame, name: str) -> pd.DataFrame:
    """[csv, point, why] of the suspect rows, and of the rows kept but measured beside other
    jobs (`BESIDE`); a point is named by the keys that vary in `df`."""
    shown = is_suspect(df)
    if BESIDE in df:
        shown |= text_column(df[BESIDE]).str.len() > 0
    s = df[shown]
    keys = [k for k in POINT_KEYS if k in df and df[k].nunique(dropna=True) > 1]
    if not keys:  # one point (or all alike): name it by the keys it has
        keys = [k for k in POINT_KEYS if k in df and df[k].notna().any()][:4]
    return pd.DataFrame(
        {
            "csv": [f"{name}.csv"] * len(s),
            "point": [point_label(r, keys) for _, r in s.iterrows()],
            "why": [_why(r) for _, r in s.iterrows()],
        }
    )


# --------------------------------------------------------------------- what a section read

_FOUND: ContextVar[dict | None] = ContextVar("sanity_found", default=None)


def _record(name: str | None, df: pd.DataFrame) -> None:
    found = _FOUND.get()
    if found is not None and name:
        found[name] = suspect_rows(df, name)


@contextlib.contextmanager
def collecting() -> Iterator[dict[str, pd.DataFrame]]:
    """Collects {csv name: suspect rows} of every CSV flagged inside the block (the report
    wraps each section's `context()` in it)."""
    token = _FOUND.set({})
    try:
        yield _FOUND.get()
    finally:
        _FOUND.reset(token)


def owned(found: dict[str, pd.DataFrame], stage: str) -> pd.DataFrame:
    """The suspect rows of the stage's own CSVs (`<stage>.csv`, `<stage>_*.csv`)."""
    frames = [
        rows
        for name, rows in sorted(found.items())
        if (name == stage or name.startswith(stage + "_")) and len(rows)
    ]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
