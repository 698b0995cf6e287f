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


def growth_sentence(df: pd.DataFrame) -> str:
    eager = trusted(df[df["impl"] == "naive_eager"], scope="memory")
    col = "mem_before_backward_mb"
    if col not in eager or eager[col].notna().sum() < 2:
        col = "expected_before_backward_mb"
        source = "counted (no device memory counters on this machine)"
    else:
        source = "measured"
    d = eager["d_head"].max() if len(eager) else None
    g = eager[(eager["d_head"] == d) & eager[col].notna()].sort_values("seq_len")
    if len(g) < 2:
        return "Too few successful points to see how saved memory grows."
    x, y = np.log(g["seq_len"].to_numpy(float)), np.log(g[col].to_numpy(float))
    slope = float(np.polyfit(x[-3:], y[-3:], 1)[0])
    if slope >= 1.5:
        why = (
            "close to quadratic, because the saved probability matrix P is n x n per batch "
            "element; the O(n d) tensors only matter at short lengths"
        )
    else:
        why = (
            "not yet quadratic at these lengths: the O(n d) tensors (Q, K, V, O and their "
            "gradients) and fixed allocations still weigh as much as the n x n matrix P; the n² "
            "term takes over at longer lengths"
        )
    return (
        f"Memory in use before backward ({source}, d = {d}) grows as n^{slope:.2f} over the longest "
        f"lengths: {why}."
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


def bwd_fwd_sentence(df: pd.DataFrame) -> str:
    """Backward against forward time of the eager points, and why: twice the matmul work where
    the ratio shows it; where it does not, the steps' spread or the sizes, whichever applies."""
    ok = trusted(df[df["impl"] == "naive_eager"])
    if len(ok) == 0:
        return ""
    ratio = ok["bwd_ms_mean"] / ok["fwd_ms_mean"]
    head = f"Backward takes {ratio.median():.2f}× the forward time " + (
        f"(median over {len(ok)} eager points, {ratio.min():.2f}–{ratio.max():.2f}×)"
        if len(ok) > 1
        else "(one eager point)"
    )
    work = "twice the matmul work (dQ, dK from dS; dV, dP from dO)"
    if ratio.median() >= BWD_FWD_EXPECTED:
        return head + f": it runs {work} and reads P besides writing two (n x n) buffers."
    spread = max(
        (ok["fwd_ms_std"] / ok["fwd_ms_mean"]).max(), (ok["bwd_ms_std"] / ok["bwd_ms_mean"]).max()
    )
    if spread > NOISY_SPREAD:
        why = (
            f"the passes' std reaches {spread:.0%} of their mean here, so these steps do not "
            "settle the ratio"
        )
    else:
        why = (
            f"at these sizes (a forward of at most {fmt(ok['fwd_ms_mean'].max())} ms) each "
            "call's fixed costs, which both passes pay, weigh against the FLOPs"
        )
    return head + f": short of the 2× that {work} predicts; {why}."
