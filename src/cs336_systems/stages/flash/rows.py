"""The `flash` stage's rows as the report reads them: implementation labels and order, a pass's
latency, the sweep's rows, speed-ups of our Triton kernel, the section's tables (our kernels
against naive attention, every implementation, TFLOP/s, tiles, errors, the leaderboard point)
and the fixed-cost target's points. Used by analysis.py, answers.py and figures.py."""

from __future__ import annotations

import numpy as np
import pandas as pd

from cs336_systems.reporting import sanity
from cs336_systems.reporting.analysis import fmt, md_table, sig
from cs336_systems.reporting.analysis import ok as trusted
from cs336_systems.stages.flash.rounds import ROUNDS_MS, parse_rounds

IMPL_ORDER = [
    "naive_eager",
    "naive_compiled",
    "flash_pytorch",
    "flash_triton",
    "sdpa_flash",
    "sdpa_cudnn",
    "sdpa_efficient",
]
IMPL_LABELS = {
    "naive_eager": "naive (eager)",
    "naive_compiled": "naive (compiled)",
    "flash_pytorch": "our FA2 (PyTorch)",
    "flash_triton": "our FA2 (Triton)",
    "sdpa_flash": "SDPA flash",
    "sdpa_cudnn": "SDPA cuDNN",
    "sdpa_efficient": "SDPA efficient",
}
# the handout's grid (flash_benchmarking (a)): every power of two from 128 to 65536, d = 16 to
# 128, bf16 and fp32
HANDOUT_SEQ_LENS = [2**i for i in range(7, 17)]
HANDOUT_HEAD_DIMS = [16, 32, 64, 128]
HANDOUT_DTYPES = ["bf16", "fp32"]
PASSES = {"fwd": "forward", "bwd": "backward", "fwd_bwd": "forward+backward"}
# the latency table's implementations and their short names
PAIR_SHORT = {"naive_eager": "naive", "flash_pytorch": "FA2-pt", "flash_triton": "FA2-triton"}


def label(impl: str) -> str:
    return IMPL_LABELS.get(impl, impl)


def ms(df: pd.DataFrame, prefix: str) -> pd.Series:
    """The latency statistic of a pass: the median (do_bench and the harness both record it)."""
    col = f"{prefix}_ms_median"
    return df[col] if col in df else pd.Series(np.nan, index=df.index)


def impls_of(df: pd.DataFrame) -> list[str]:
    """The implementations of `df`, the known ones in IMPL_ORDER, then the others by name."""
    present = set(df["impl"])
    return [i for i in IMPL_ORDER if i in present] + sorted(present - set(IMPL_ORDER))


def sweep(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["grid"] == "sweep"] if "grid" in df else df


def grid_rows(df: pd.DataFrame, grid: str) -> pd.DataFrame:
    """The rows of one of the other jobs (`target`, `leaderboard`); none in a CSV without."""
    return df[df["grid"] == grid] if "grid" in df else df.iloc[:0]


# the one host-bound rule, from a row's own numbers: its forward+backward timed as one call
# takes more than HOST_RATIO times its forward plus its backward timed apart (the one call pays
# autograd's and the launches' host work while the device idles; the passes timed apart hide it)
HOST_RATIO = 1.25


def host_ratio(df: pd.DataFrame) -> pd.Series:
    """Each row's forward+backward / (forward + backward); NaN where a pass has no time."""
    return ms(df, "fwd_bwd") / (ms(df, "fwd") + ms(df, "bwd"))


def is_host_bound(df: pd.DataFrame) -> pd.Series:
    """The rows the one host-bound rule (HOST_RATIO) marks."""
    return host_ratio(df) > HOST_RATIO


SPEEDUP_COLUMNS = ["dtype", "d_head", "seq_len", "impl", "speedup", "ours_host", "theirs_host"]


def speedups(df: pd.DataFrame, ours: str = "flash_triton", prefix: str = "fwd_bwd") -> pd.DataFrame:
    """other implementation's time / ours, per (dtype, d, n) where both ran, and whether our
    row or theirs is host-bound by its own numbers (`ours_host`, `theirs_host`)."""
    ok = sweep(df)
    ok = trusted(ok)
    ok = ok.assign(ms=ms(ok, prefix), host=is_host_bound(ok))
    keys = ["dtype", "d_head", "seq_len"]
    mine = ok[ok["impl"] == ours].set_index(keys)
    rows = []
    for impl in impls_of(ok):
        if impl == ours:
            continue
        other = ok[ok["impl"] == impl].set_index(keys)
        for key in mine.index.intersection(other.index):
            a, b = other.loc[key], mine.loc[key]
            rows.append(
                {
                    **dict(zip(keys, key, strict=True)),
                    "impl": impl,
                    "speedup": a["ms"] / b["ms"],
                    "ours_host": bool(b["host"]),
                    "theirs_host": bool(a["host"]),
                }
            )
    return pd.DataFrame(rows, columns=SPEEDUP_COLUMNS)


def cell(row, prefix: str) -> str:
    """A table's cell of one pass: its median ms (⚠ where suspect), or why it has none."""
    if row["status"] == "ok":
        suspect = str(row.get(sanity.COLUMN, "")).startswith(sanity.PREFIX)
        return fmt(float(ms(row.to_frame().T, prefix).iloc[0]), 3) + (" ⚠" if suspect else "")
    status = str(row["status"])
    return "OOM" if status == "oom" else ("skip" if status.startswith("skipped") else "err")


def pair_impls(sw: pd.DataFrame) -> list[str]:
    """The latency table's implementations that the sweep ran."""
    return [i for i in PAIR_SHORT if i in set(sw["impl"])]


def triton_vs_pytorch_table(df: pd.DataFrame, dtype: str, speedup: bool = True) -> str:
    """The assignment's table: forward, backward and forward+backward of our Triton kernel next
    to naive PyTorch attention (and our PyTorch FA2), per (d, n); `speedup`: with naive's time
    over ours (not where our kernel ran in the interpreter), marked where either row is
    host-bound (`is_host_bound`)."""
    sub = sweep(df)
    sub = sub[sub["dtype"] == dtype]
    impls = pair_impls(sub)
    rows = []
    for (d, n), g in sub.groupby(["d_head", "seq_len"]):
        row = {"d": d, "n": n}
        by = {r["impl"]: r for _, r in g.iterrows()}
        for impl in impls:
            if impl not in by:
                continue
            for prefix, name in (("fwd", "fwd"), ("bwd", "bwd"), ("fwd_bwd", "f+b")):
                row[f"{PAIR_SHORT[impl]} {name}"] = cell(by[impl], prefix)
        if speedup and "naive_eager" in by and "flash_triton" in by:
            a, b = by["naive_eager"], by["flash_triton"]
            pair = pd.DataFrame([a, b])
            if len(trusted(pair)) == 2:
                host = " (host-bound)" if is_host_bound(pair).any() else ""
                x = a["fwd_bwd_ms_median"] / b["fwd_bwd_ms_median"]
                row["speedup f+b"] = f"{x:.2g}×{host}"
        rows.append(row)
    return md_table(pd.DataFrame(rows), floatfmt=3)


def all_impls_table(df: pd.DataFrame, dtype: str, prefix: str = "fwd_bwd") -> str:
    sub = sweep(df)
    sub = sub[sub["dtype"] == dtype]
    impls = impls_of(sub)
    rows = []
    for (d, n), g in sub.groupby(["d_head", "seq_len"]):
        by = {r["impl"]: r for _, r in g.iterrows()}
        row = {"d": d, "n": n}
        for impl in impls:
            row[label(impl)] = cell(by[impl], prefix) if impl in by else "–"
        rows.append(row)
    return md_table(pd.DataFrame(rows), floatfmt=3)


def tflops_table(df: pd.DataFrame) -> str:
    ok = sweep(df)
    ok = trusted(ok)
    if len(ok) == 0 or "fwd_bwd_tflops" not in ok:
        return ""
    rows = []
    for (dt, impl), g in ok.groupby(["dtype", "impl"]):
        best = g.loc[g["fwd_bwd_tflops"].idxmax()]
        rows.append(
            {
                "dtype": dt,
                "implementation": label(impl),
                "best fwd+bwd TFLOP/s": best["fwd_bwd_tflops"],
                "at d, n": f"{int(best['d_head'])}, {int(best['seq_len'])}",
                "best fwd TFLOP/s": g["fwd_tflops"].max(),
                "best bwd TFLOP/s": g["bwd_tflops"].max(),
            }
        )
    out = pd.DataFrame(rows)
    out["_o"] = out["implementation"].map(
        lambda x: list(IMPL_LABELS.values()).index(x) if x in IMPL_LABELS.values() else 99
    )
    for col in ("best fwd+bwd TFLOP/s", "best fwd TFLOP/s", "best bwd TFLOP/s"):
        out[col] = out[col].map(sig)
    return md_table(out.sort_values(["dtype", "_o"]).drop(columns="_o"))


def tiles_table(df: pd.DataFrame) -> str:
    tri = sweep(df)
    tri = tri[(tri["impl"] == "flash_triton") & (tri["status"] == "ok")]
    if len(tri) == 0 or "triton_fwd_config" not in tri:
        return ""
    cols = ["triton_fwd_config", "triton_dkdv_config", "triton_dq_config"]
    rows = []
    for (dt, d), g in tri.groupby(["dtype", "d_head"]):
        for cfg, gg in g.groupby(cols, dropna=False):
            ns = sorted(int(x) for x in gg["seq_len"])
            rows.append(
                {
                    "dtype": dt,
                    "d": d,
                    "n": ", ".join(str(x) for x in ns),
                    "forward": cfg[0],
                    "backward dK/dV": cfg[1],
                    "backward dQ": cfg[2],
                }
            )
    return md_table(pd.DataFrame(rows))


def tiles_autotuned(sw: pd.DataFrame) -> bool:
    """Whether our kernel's forward tiles were autotuned (the config names its warps)."""
    if "triton_fwd_config" not in sw:
        return False
    configs = sw.loc[sw["impl"] == "flash_triton", "triton_fwd_config"]
    return bool(configs.astype(str).str.contains(" w").any())


def errors_table(sw: pd.DataFrame) -> str:
    """The sweep's points that failed, counted per implementation, dtype and error."""
    errors = sw[sw["status"].astype(str).str.startswith("error")]
    if not len(errors):
        return ""
    return md_table(
        errors.assign(impl=errors["impl"].map(label))
        .groupby(["impl", "dtype", "status"], as_index=False)
        .agg(points=("seq_len", "size"))
    )


def skipped_table(sw: pd.DataFrame) -> str:
    """The sweep's points not run for a reason of this preset (a `max_seq_len` cap, the
    interpreter), each with its computed reason; those the kernel tests gated are said apart."""
    status = sw["status"].astype(str)
    skipped = sw[status.str.startswith("skipped") & ~status.str.startswith("skipped: kernel")]
    if not len(skipped):
        return ""
    rows = [
        {
            "implementation": label(r["impl"]),
            "dtype": r["dtype"],
            "d": int(r["d_head"]),
            "n": int(r["seq_len"]),
            "why": str(r["status"]).removeprefix("skipped: "),
        }
        for _, r in skipped.sort_values(["impl", "dtype", "d_head", "seq_len"]).iterrows()
    ]
    return md_table(pd.DataFrame(rows), numparse=False)


def ratio(x: float) -> str:
    """Two decimals, three where two would round onto the target's 1 (1.003 is not 1.00)."""
    return f"{x:.3f}" if f"{x:.2f}" == "1.00" and x != 1 else f"{x:.2f}"


# ---- the leaderboard point -------------------------------------------------------------------


def has_compiled(lb: pd.DataFrame) -> bool:
    """Whether the leaderboard's own compiled measurement (`lb_*`, CUDA only) is there."""
    return "lb_ms_median" in lb and lb["lb_ms_median"].notna().any()


def leaderboard_ms(ok: pd.DataFrame, impl: str, compiled: bool) -> float | None:
    """`impl`'s time at the leaderboard point (`ok`: its trusted rows by implementation), by the
    compiled measurement or forward+backward; None where it has none."""
    col = "lb_ms_median" if compiled else "fwd_bwd_ms_median"
    if impl in ok.index and ok.loc[impl, col] == ok.loc[impl, col]:
        return float(ok.loc[impl, col])
    return None


def leaderboard_table(lb: pd.DataFrame) -> str:
    """Each implementation's passes at the leaderboard point (and the compiled measurement)."""
    compiled = has_compiled(lb)
    rows = []
    for _, r in lb.iterrows():
        row = {
            "implementation": label(r["impl"]),
            "fwd ms": cell(r, "fwd"),
            "bwd ms": cell(r, "bwd"),
            "fwd+bwd ms": cell(r, "fwd_bwd"),
            "fwd+bwd TFLOP/s": sig(r.get("fwd_bwd_tflops", float("nan"))),
        }
        if compiled:
            row["compiled, o.sum() ms"] = cell(r, "lb")
            row["compiled TFLOP/s"] = sig(r.get("lb_tflops", float("nan")))
        row["status"] = r["status"]
        rows.append(row)
    return md_table(pd.DataFrame(rows))


def bf16_peak(ceilings: pd.DataFrame | None) -> float | None:
    if ceilings is None or len(ceilings) == 0 or "kind" not in ceilings:
        return None
    mm = ceilings[
        (ceilings["kind"] == "matmul")
        & (ceilings["dtype"] == "bf16")
        & (ceilings["status"] == "ok")
    ]
    return float(mm["tflops"].max()) if len(mm) else None


# ---- the fixed-cost target -------------------------------------------------------------------

# the fixed-cost target: our forward+backward against SDPA cuDNN's, at most this ratio
TARGET_BOUNDS = ((4096, 1.0), (0, 1.5))  # n >= 4096: at most cuDNN; shorter: at most 1.5x
TARGET_PAIR = ("flash_triton", "sdpa_cudnn")


def target_bound(n: int) -> float | None:
    """The ratio ours/cuDNN the target allows at length n: 1.0 from n = 4096 on, 1.5 at
    n <= 1024, none in between."""
    if n >= TARGET_BOUNDS[0][0]:
        return TARGET_BOUNDS[0][1]
    return TARGET_BOUNDS[1][1] if n <= 1024 else None


def target_points(ok: pd.DataFrame) -> list[dict]:
    """Per (d, n) where ours and cuDNN both ran: their forward+backward (the paired rounds'
    medians where there are rounds: rounds.py), the ratio ours / cuDNN (the median of the
    rounds' ratios, else the single windows'), each round's ratio, the target's bound and the
    verdict; a point either side of which failed a sanity check is `suspect`, judged nowhere."""
    ok = ok.assign(_suspect=sanity.is_suspect(ok))
    keys = ["d_head", "seq_len"]
    wide = ok.pivot_table(
        index=keys, columns="impl", values="fwd_bwd_ms_median", aggfunc="first"
    ).dropna(subset=list(TARGET_PAIR))
    flags = ok.pivot_table(index=keys, columns="impl", values="_suspect", aggfunc="max")
    paired = ok.assign(
        _r=ok.get(ROUNDS_MS, pd.Series(index=ok.index, dtype=object)).map(parse_rounds)
    )
    paired = paired.set_index([*keys, "impl"])["_r"]
    points = []
    for (d, n), r in wide.iterrows():
        ratio_ = single = r["flash_triton"] / r["sdpa_cudnn"]
        mine_r, theirs_r = (paired.get((d, n, i), []) for i in TARGET_PAIR)
        if len(mine_r) != len(theirs_r):
            mine_r = theirs_r = []
        each = [a / b for a, b in zip(mine_r, theirs_r, strict=True)]
        if each:  # the paired rounds (rounds.py): their medians and the median of their ratios
            ratio_ = float(np.median(each))
            r = pd.Series({"flash_triton": np.median(mine_r), "sdpa_cudnn": np.median(theirs_r)})
        mine, theirs = (bool(flags.loc[(d, n), i]) for i in TARGET_PAIR)
        bound = target_bound(int(n))
        if bound is None:
            verdict = ""
        elif mine or theirs:
            verdict = "suspect"
        else:
            verdict = "met" if ratio_ <= bound else "not met"
        points.append(
            {"d": int(d), "n": int(n), "ours": r["flash_triton"], "theirs": r["sdpa_cudnn"],
             "ours_suspect": mine, "theirs_suspect": theirs, "ratio": ratio_, "each": each,
             "single": single, "bound": bound, "verdict": verdict}
        )  # fmt: skip
    return points


def target_table(points: list[dict]) -> str:
    """The target's points as the report shows them (the rounds' columns where there are)."""
    rows = [
        {
            "d": p["d"],
            "n": p["n"],
            "ours (ms)": fmt(p["ours"], 3) + (" ⚠" if p["ours_suspect"] else ""),
            "SDPA cuDNN (ms)": fmt(p["theirs"], 3) + (" ⚠" if p["theirs_suspect"] else ""),
            "ours / cuDNN": ratio(p["ratio"]),
            "rounds": f"{ratio(min(p['each']))}-{ratio(max(p['each']))}" if p["each"] else "",
            "single windows": ratio(p["single"]),
            "target": "" if p["bound"] is None else f"<= {p['bound']:g}",
            "verdict": p["verdict"],
        }
        for p in points
    ]
    table = pd.DataFrame(rows)
    rounds = any(p["each"] for p in points)
    return md_table(table if rounds else table.drop(columns=["rounds", "single windows"]))
