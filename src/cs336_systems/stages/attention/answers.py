"""The `attention` section's answers in words: what the smallest configuration that ran out of
memory needs (or where one would start to), how the memory saved for backward grows with the
length, what torch.compile does to naive attention and to the whole model, and why backward
costs what it does against forward."""

from __future__ import annotations

import numpy as np
import pandas as pd

from cs336_systems.reporting.analysis import fmt
from cs336_systems.reporting.analysis import ok as trusted

# backward runs twice forward's matmuls: a median ratio below this is not explained by that
BWD_FWD_EXPECTED = 1.5
# a pass whose std is above this share of its mean cannot settle a ratio of means
NOISY_SPREAD = 0.2
# a memory growth exponent within this of 2 is called close to quadratic
NEAR_QUADRATIC = 0.2

MIB = 2**20


def oom_accounting(df: pd.DataFrame) -> dict:
    """The smallest configuration that ran out of memory (fewest bytes of score matrix, then
    smallest d) and what its tensors need; or, when nothing ran out, where it would start."""
    eager = df[df["impl"] == "naive_eager"] if "naive_eager" in set(df["impl"]) else df
    oom = eager[eager["status"] == "oom"]
    device_mb = float(df["device_memory_mb"].max()) if "device_memory_mb" in df else float("nan")
    if len(oom):
        r = oom.sort_values(["seq_len", "d_head"]).iloc[0]
        b, n, d = int(r["batch_size"]), int(r["seq_len"]), int(r["d_head"])
        return {
            "any": True,
            "config": f"batch {b}, d = {d}, n = {n}",
            "phase": r.get("oom_phase", ""),
            "lines": accounting_lines(b, n, d, device_mb),
        }
    ok = trusted(eager, scope="memory")
    if len(ok) == 0:
        return {
            "any": False,
            "projection": "No point ran and passed the sanity checks, so there is nothing to "
            "project from.",
        }
    b = int(ok["batch_size"].iloc[0])
    d = int(ok["d_head"].min())
    n_max = int(ok["seq_len"].max())
    if device_mb != device_mb:
        return {
            "any": False,
            "projection": f"This device reports no memory size (CPU); the largest point, n = {n_max}, "
            f"counted {fmt(float(ok['expected_backward_peak_mb'].max()), 0)} MiB at backward's peak.",
        }
    n = n_max
    while _backward_peak_mb(b, n, d) < device_mb:
        n *= 2
    return {
        "any": False,
        "projection": (
            f"No configuration ran out of the device's {fmt(device_mb / 1024, 1)} GiB. By the count "
            f"below, batch {b} at d = {d} would first fail at n = {n}:"
        ),
        "lines": accounting_lines(b, n, d, device_mb),
    }


def _backward_peak_mb(b: int, n: int, d: int) -> float:
    return (8 * b * n * d + 3 * b * n * n) * 4 / MIB


def accounting_lines(b: int, n: int, d: int, device_mb: float) -> list[str]:
    nn = b * n * n * 4 / MIB
    nd = b * n * d * 4 / MIB
    lines = [
        f"one (batch x n x n) fp32 matrix: {b} x {n}² x 4 B = {fmt(nn, 0)} MiB",
        f"forward: the scores S and the probabilities P are both alive inside softmax: "
        f"2 x {fmt(nn, 0)} = {fmt(2 * nn, 0)} MiB (+ Q, K, V, O: {fmt(4 * nd, 1)} MiB)",
        f"kept for backward: P ({fmt(nn, 0)} MiB; softmax saves its output, and P V needs it) "
        f"plus Q, K, V; with O and dO that is {fmt(nn + 5 * nd, 0)} MiB before backward starts",
        f"backward: dP = dO Vᵀ and dS = P ∘ (dP − rowsum(dP ∘ P)) are two more n x n buffers: "
        f"≈ {fmt(3 * nn + 8 * nd, 0)} MiB at its peak",
    ]
    if device_mb == device_mb:
        lines.append(f"device memory: {fmt(device_mb, 0)} MiB")
    return lines


def _memory_column(eager: pd.DataFrame) -> tuple[str, str]:
    """The memory before backward to fit: measured by the device's counters, else the count of
    the tensors (measure.py `memory_accounting`), and the words that say which."""
    if "mem_before_backward_mb" in eager and eager["mem_before_backward_mb"].notna().sum() >= 2:
        return "mem_before_backward_mb", "measured"
    return (
        "expected_before_backward_mb",
        "counted from the tensor shapes, not measured: this machine has no device memory counters",
    )


def _exponent(g: pd.DataFrame, col: str) -> float:
    """The slope of log `col` against log n (a least-squares line; the slope between two points)."""
    x, y = np.log(g["seq_len"].to_numpy(float)), np.log(g[col].to_numpy(float))
    return float(np.polyfit(x, y, 1)[0])


def _lengths(g: pd.DataFrame) -> str:
    """Which lengths the exponent rests on, and how many."""
    n = [f"{int(v):,}" for v in g["seq_len"]]
    if len(n) == 2:
        return f"from n = {n[0]} to n = {n[1]} (a slope between only two lengths)"
    return f"over n = {', '.join(n[:-1])} and {n[-1]} (a least-squares slope over {len(n)} lengths)"


def _p_share(g: pd.DataFrame) -> str:
    """What share of the count before backward the n x n matrix P is, at the first and last
    lengths of `g`."""
    share = (g["probs_mb"] / g["expected_before_backward_mb"]).to_numpy()
    n = g["seq_len"].astype(int).to_numpy()
    return (
        f"the n x n probability matrix P saved for backward is {share[0]:.0%} of the count at "
        f"n = {n[0]:,} and {share[-1]:.0%} at n = {n[-1]:,}"
    )


def _shape(slope: float) -> str:
    """An exponent in words: close to quadratic only within `NEAR_QUADRATIC` of 2."""
    if abs(slope - 2) <= NEAR_QUADRATIC:
        return "close to quadratic"
    if 1 < slope < 2:
        return "between linear and quadratic"
    return "faster than quadratic" if slope > 2 else "no faster than linear"


def growth_sentence(df: pd.DataFrame) -> str:
    """How memory before backward grows with n over the (up to) three longest lengths, in words
    that follow the exponent (`_shape`), with P's share of the count beside it."""
    eager = trusted(df[df["impl"] == "naive_eager"], scope="memory")
    col, source = _memory_column(eager)
    d = eager["d_head"].max() if len(eager) else None
    g = eager[(eager["d_head"] == d) & eager[col].notna()].sort_values("seq_len").iloc[-3:]
    if len(g) < 2:
        return "Too few successful points to see how saved memory grows."
    slope = _exponent(g, col)
    shape = _shape(slope)
    head = f"Memory in use before backward (d = {d}; {source}) grows as n^{slope:.2f} {_lengths(g)}"
    if shape != "between linear and quadratic":
        return f"{head}: {shape}; {_p_share(g)}."
    count = _exponent(g, "expected_before_backward_mb")
    beside = "" if col == "expected_before_backward_mb" else f" (the count alone: n^{count:.2f})"
    return (
        f"{head}: {shape}, as {_p_share(g)}, so the five O(n d) tensors (Q, K, V, O, dO) still "
        f"weigh beside it; the count tends to n² only as P takes over{beside}."
    )


def _compile_why(df: pd.DataFrame, median_fwd: float) -> str:
    """Why compiling changes attention's time, as far as the run's device and mask say."""
    causal = bool(df["causal"].iloc[0]) if "causal" in df and len(df) else False
    fused = "the scaling, masking and softmax" if causal else "the scaling and softmax"
    cuda = str(df["device"].iloc[0]) == "cuda" if "device" in df and len(df) else False
    if median_fwd < 1:
        return (
            "compiling does not pay at these sizes: the generated code's launch and guard "
            "overheads outweigh the memory traffic that fusing saves"
        )
    if cuda:
        return (
            f"Inductor fuses {fused} into generated Triton kernels, so the (n x n) matrix is "
            "read and written fewer times, while the two matmuls stay cuBLAS calls"
        )
    return (
        f"Inductor fuses {fused} into generated C++ loops, so the (n x n) matrix is read and "
        "written fewer times, while the two matmuls stay calls into the CPU's BLAS"
    )


def compile_sentence(df: pd.DataFrame, sp: pd.DataFrame) -> str:
    """How much torch.compile speeds naive attention up (`sp`: rows.py `speedups`), and why."""
    return (
        f"torch.compile speeds naive attention's forward by {sp['fwd_speedup'].median():.2f}× "
        f"(median; {sp['fwd_speedup'].min():.2f}–{sp['fwd_speedup'].max():.2f}×) and its "
        f"backward by {sp['bwd_speedup'].median():.2f}× "
        f"({sp['bwd_speedup'].min():.2f}–{sp['bwd_speedup'].max():.2f}×) over "
        f"{len(sp)} points; {_compile_why(df, float(sp['fwd_speedup'].median()))}."
    )


def compile_losers(sp: pd.DataFrame) -> str:
    """Where compiled is slower than eager, in either pass."""
    loses = sp[(sp["fwd_speedup"] < 1) | (sp["bwd_speedup"] < 1)]
    if not len(loses):
        return "Compiled is never slower here."
    return "Compiled is slower at " + ", ".join(_loss(r) for r in loses.itertuples()) + "."


def _loss(r) -> str:
    """'d=16 n=4096 (forward 0.93×)': the point and each pass compiled loses, with its speed-up."""
    passes = [(w, s) for w, s in (("forward", r.fwd_speedup), ("backward", r.bwd_speedup)) if s < 1]
    return f"d={r.d_head} n={r.seq_len} (" + ", ".join(f"{w} {s:.2f}×" for w, s in passes) + ")"


def model_compile_sentence(table: pd.DataFrame) -> str:
    """The whole model's speed-up from compiling (rows.py `model_compile`)."""
    return (
        f"On the whole model (benchmark stage), compiling speeds it up by "
        f"{table['speedup'].median():.2f}× "
        + (
            f"(median over {len(table)} points, "
            f"{table['speedup'].min():.2f}–{table['speedup'].max():.2f}×)."
            if len(table) > 1
            else f"(one point: {table['mode'].iloc[0] if 'mode' in table else 'one mode'})."
        )
    )


PASS_NAMES = (("fwd", "forward"), ("bwd", "backward"))


def _loose_passes(r) -> list[str]:
    """'forward 54%' for each pass of row r whose std passes NOISY_SPREAD of its mean."""
    spread = {w: r[f"{p}_ms_std"] / r[f"{p}_ms_mean"] for p, w in PASS_NAMES}
    return [f"{w} {v:.0%}" for w, v in spread.items() if v > NOISY_SPREAD]


def split_noisy(ok: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """(the points whose passes are steady, 'd=16 n=64 (forward 54%)' for each other point: a
    pass's std passes NOISY_SPREAD of its mean, named with its std as a share of the mean)."""
    loose = [_loose_passes(r) for _, r in ok.iterrows()]
    noisy = [
        f"d={r['d_head']} n={r['seq_len']} ({', '.join(passes)})"
        for (_, r), passes in zip(ok.iterrows(), loose, strict=True)
        if passes
    ]
    return ok[[not passes for passes in loose]], noisy


def bwd_fwd_sentence(df: pd.DataFrame) -> str:
    """Backward against forward time of the eager points, and why. Points where a pass's spread
    is wide are named and left out; the ratio rests on the steady rest where at least two
    remain (twice the matmul work where it shows, the sizes where it does not), and is loose
    as a whole where fewer do."""
    ok = trusted(df[df["impl"] == "naive_eager"])
    if len(ok) == 0:
        return ""
    work = "twice the matmul work (dQ, dK from dS; dV, dP from dO)"
    steady, noisy = split_noisy(ok)
    if noisy and len(steady) < 2:
        return _bwd_fwd_head(ok, "eager points") + (
            f": loose, since a pass's std passes {NOISY_SPREAD:.0%} of its mean at "
            f"{' and '.join(noisy)}, so these steps do not settle it against the 2× that "
            f"{work} predicts."
        )
    ratio = steady["bwd_ms_mean"] / steady["fwd_ms_mean"]
    head = _bwd_fwd_head(steady, "steady eager points" if noisy else "eager points")
    if ratio.median() >= BWD_FWD_EXPECTED:
        text = head + f": it runs {work} and reads P besides writing two (n x n) buffers."
    else:
        text = head + (
            f": short of the 2× that {work} predicts; at these sizes (a forward of at most "
            f"{fmt(steady['fwd_ms_mean'].max())} ms) each call's fixed costs, which both passes "
            "pay, weigh against the FLOPs."
        )
    if noisy:
        text += (
            f" Left out, as a pass's std passes {NOISY_SPREAD:.0%} of its mean there: "
            f"{', '.join(noisy)}."
        )
    return text


def _bwd_fwd_head(pts: pd.DataFrame, what: str) -> str:
    """'Backward takes 1.85× the forward time (median over 13 <what>, 1.55–3.34×)'."""
    ratio = pts["bwd_ms_mean"] / pts["fwd_ms_mean"]
    return f"Backward takes {ratio.median():.2f}× the forward time " + (
        f"(median over {len(pts)} {what}, {ratio.min():.2f}–{ratio.max():.2f}×)"
        if len(pts) > 1
        else f"(one {what.removesuffix('s')})"
    )
