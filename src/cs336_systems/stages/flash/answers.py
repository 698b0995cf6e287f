"""The FlashAttention section's answers in words: what the latency table's columns hold, where
a forward+backward timed as one call measures the host rather than the kernels (flash_benchmarking
(a)), our Triton kernel's speed-ups, the implementations that ran out of memory, the kernel tests'
verdicts, the leaderboard point against SDPA, where the fixed-cost target holds, and what the run
leaves unanswered (coverage). A point is host-bound when its forward+backward takes more than
HOST_RATIO times its forward plus its backward timed apart: the one call pays autograd's and the
launches' host work that the GPU idles through, which the passes timed apart overlap with their
own kernels."""

from __future__ import annotations

import pandas as pd

from cs336_systems.reporting import sanity
from cs336_systems.reporting.analysis import faster_or_slower, fmt, plural, sig
from cs336_systems.stages.flash.rows import (
    HANDOUT_DTYPES,
    HANDOUT_HEAD_DIMS,
    HANDOUT_SEQ_LENS,
    HOST_RATIO,
    IMPL_LABELS,
    PAIR_SHORT,
    host_ratio,
    label,
    leaderboard_ms,
    ratio,
    speedups,
    sweep,
)

# the most host time one forward+backward call of ours took on our H100 hosts (0.30-0.58 ms,
# docs/notes/flash-attention-notes.md, the fixed host cost rounds): a GPU point whose one call exceeds
# its passes timed apart by more than this is not explained by the host's work alone
HOST_GAP_MS = 0.6
LONG = {
    "naive_eager": "naive PyTorch attention",
    "flash_pytorch": "our FlashAttention-2 in PyTorch",
    "flash_triton": "our FlashAttention-2 in Triton",
}


def pair_caption(impls: list[str]) -> str:
    """The latency table's implementations, as its columns hold them (only those)."""
    named = [f"{LONG[i]} (`{PAIR_SHORT[i]}`)" for i in PAIR_SHORT if i in impls]
    return ", ".join(named[:-1]) + (" and " if len(named) > 1 else "") + named[-1] if named else ""


def host_bound(d: pd.DataFrame) -> pd.DataFrame:
    """The trusted sweep rows with their ratio forward+backward / (forward + backward)."""
    need = {"fwd_ms_median", "bwd_ms_median", "fwd_bwd_ms_median"}
    if d.empty or not need <= set(d):
        return d.iloc[:0]
    return d.assign(host_ratio=host_ratio(d))


def host_note(d: pd.DataFrame, ours: str = "flash_triton") -> str:
    """Where our kernel's forward+backward is host-bound, with the worst example and the length
    from which it is not."""
    h = host_bound(d[d["impl"] == ours])
    if h.empty:
        return ""
    hit = h[h["host_ratio"] > HOST_RATIO]
    if hit.empty:
        return (
            f"Our kernel's forward+backward takes at most {h['host_ratio'].max():.2f}× its "
            "forward plus its backward timed apart at every point: no speed-up below is the "
            "host's."
        )
    w = hit.loc[hit["host_ratio"].idxmax()]
    clean = sorted(set(h["seq_len"]) - set(hit["seq_len"]))
    longest = int(hit["seq_len"].max())
    return (
        f"At {plural(len(hit), 'point')} of {len(h)} (n up to {longest:,}) our kernel's "
        f"forward+backward, timed as one call, takes {hit['host_ratio'].min():.2f}–"
        f"{hit['host_ratio'].max():.2f}× its forward plus its backward timed apart (the worst: "
        f"{w['dtype']}, d = {int(w['d_head'])}, n = {int(w['seq_len']):,}: "
        f"{fmt(w['fwd_ms_median'], 3)} + {fmt(w['bwd_ms_median'], 3)} against "
        f"{fmt(w['fwd_bwd_ms_median'], 3)} ms). The one call pays the host's work (autograd, "
        "the launches) while the device waits, so forward+backward times and speed-ups at those "
        "points measure host overhead, not the kernels"
        + (
            f"; from n = {min(n for n in clean if n > longest):,} on the two agree within "
            f"{HOST_RATIO - 1:.0%}."
            if any(n > longest for n in clean)
            else "."
        )
        + _gap_note(hit)
    )


def _gap_note(hit: pd.DataFrame) -> str:
    """GPU points whose one call takes more than HOST_GAP_MS beyond its passes timed apart:
    more than the host's whole call, so not the host's work alone."""
    if "device" not in hit:
        return ""
    gap = hit["fwd_bwd_ms_median"] - hit["fwd_ms_median"] - hit["bwd_ms_median"]
    big = hit[(hit["device"].astype(str) == "cuda") & (gap > HOST_GAP_MS)]
    if big.empty:
        return ""
    each = "; ".join(
        f"{r['dtype']}, d = {int(r['d_head'])}, n = {int(r['seq_len']):,}: "
        f"{fmt(r['fwd_bwd_ms_median'], 3)} ms against {fmt(r['fwd_ms_median'], 3)} + "
        f"{fmt(r['bwd_ms_median'], 3)}"
        for _, r in big.iterrows()
    )
    return (
        f" Not so at {plural(len(big), 'point')} ({each}): the extra time exceeds the "
        f"{HOST_GAP_MS} ms that a whole call of ours takes on the host, so the host's work does "
        "not explain it; that point needs measuring again before its speed-up is read."
    )


def speedup_sentences(df: pd.DataFrame) -> list[str]:
    """Per dtype and implementation: our kernel's speed-up over the points where neither row is
    host-bound (the one rule, rows.py HOST_RATIO), how many points that is, and what was left
    out (the host-bound points, by whose row)."""
    sp = speedups(df)
    out = []
    for (dt, impl), all_ in sp.groupby(["dtype", "impl"]):
        left = all_[all_["ours_host"] | all_["theirs_host"]]
        g = all_.drop(left.index)
        head = f"{dt}: our Triton kernel against {label(impl)} on forward+backward"
        if g.empty:
            out.append(f"{head}: no point of {len(all_)} is free of host overhead" + _left(left))
            continue
        med, lo, hi = g["speedup"].median(), g["speedup"].min(), g["speedup"].max()
        loses = g[g["speedup"] < 1]
        tail = ""
        if 0 < len(loses) < len(g):
            worst = loses.loc[loses["speedup"].idxmin()]
            tail = (
                f"; slower at {len(loses)} of {len(g)}, most at d={int(worst['d_head'])}, "
                f"n={int(worst['seq_len'])}"
            )
        what = (
            f"median over {len(g)} of {len(all_)} points, n = {int(g['seq_len'].min()):,}–"
            f"{int(g['seq_len'].max()):,}; their time / ours from {lo:.3g} to {hi:.3g}"
            if len(g) > 1
            else f"one point of {len(all_)}: d={int(g['d_head'].iloc[0])}, "
            f"n={int(g['seq_len'].iloc[0])}"
        )
        out.append(f"{head}: {faster_or_slower(med)} ({what}{tail})" + _left(left))
    return out


def _left(left: pd.DataFrame) -> str:
    """The speed-up points left out as host-bound, by whose row, with their lengths."""
    if left.empty:
        return "."
    whose = []
    for col, who in (("ours_host", "ours"), ("theirs_host", "theirs")):
        hit = left[left[col]]
        if len(hit):
            ns = sorted(int(n) for n in hit["seq_len"].unique())
            whose.append(f"{who} at {len(hit)} (n = {', '.join(f'{n:,}' for n in ns)})")
    return (
        f"; left out: {plural(len(left), 'host-bound point')} (forward+backward above "
        f"{HOST_RATIO:g}× forward plus backward: {'; '.join(whose)})."
    )


def oom_sentences(df: pd.DataFrame) -> list[str]:
    """The implementations that ran out of memory in the sweep, and from which n."""
    sw = sweep(df)
    out = []
    for (dt, impl), g in sw[sw["status"] == "oom"].groupby(["dtype", "impl"]):
        out.append(
            f"{label(impl)} ({dt}) ran out of memory from n = {int(g['seq_len'].min())} "
            f"(d = {', '.join(str(int(x)) for x in sorted(g['d_head'].unique()))})."
        )
    return out


def gate_verdicts(df: pd.DataFrame) -> dict[str, str]:
    """The kernel tests' verdict on each of our kernels the rows hold, or why there is none."""
    verdicts = {}
    if "kernel_tests" not in df:
        return verdicts
    for impl in ("flash_pytorch", "flash_triton"):
        if impl not in set(df["impl"]):
            continue
        v = df.loc[df["impl"] == impl, "kernel_tests"].dropna()
        v = v[v.astype(str) != ""]
        verdicts[IMPL_LABELS[impl]] = (
            str(v.iloc[0])
            if len(v)
            else "not gated: the `kernel_tests` stage did not run before these points "
            "(it gates them when it is among the run's `stages`, as in the default "
            "`snakemake --cores 1 report`)"
        )
    return verdicts


def _listed(values: list, unit: str = "") -> str:
    return ", ".join(f"{v:,}" if isinstance(v, int) else str(v) for v in values) + unit


def grid_deviation(
    seq_lens: list[int], head_dims: list[int], dtypes: list[str], preset: str = "cpu"
) -> str:
    """Where the sweep's axes differ from the handout's grid (rows.py HANDOUT_*), in words; ''
    where it covers the whole grid. The cpu preset's small grid points to the gpu preset."""
    gaps = []
    for name, ran, asked in (
        ("n", seq_lens, HANDOUT_SEQ_LENS),
        ("d", head_dims, HANDOUT_HEAD_DIMS),
        ("dtype", dtypes, HANDOUT_DTYPES),
    ):
        missing = [v for v in asked if v not in ran]
        extra = [v for v in ran if v not in asked]
        if missing:
            gaps.append(f"{name} = {_listed(missing)} not run")
        if extra:
            gaps.append(f"{name} = {_listed(extra)} added")
    if not gaps:
        return ""
    return (
        "This run deviates from the handout's grid (n = 128 to 65,536, every power of two; "
        f"d = {_listed(HANDOUT_HEAD_DIMS)}; {' and '.join(HANDOUT_DTYPES)}): "
        + "; ".join(gaps)
        + (". The gpu and full presets run the whole grid." if preset == "cpu" else ".")
    )


GPU_RUN = "`snakemake --cores 1 report` on a CUDA GPU (the gpu preset)"


def coverage(has_sweep: bool, interpreter: bool, grids: list[str], preset: str) -> dict:
    """The section's questions the run answers only in part or not at all, and why."""
    out = {}
    if not has_sweep:
        out["flash_benchmarking.a"] = {
            "status": "not",
            "why": f"the sweep did not run: flash.csv holds only the {', '.join(grids)} rows",
        }
    elif interpreter:
        out["flash_benchmarking.a"] = {
            "status": "partly",
            "why": "our Triton kernel ran in Triton's CPU interpreter: its times measure the "
            "interpreter",
            "how": GPU_RUN,
        }
    if "leaderboard" not in grids:
        for part in ("flash_leaderboard", "ours.flash_leaderboard"):
            out[part] = {
                "status": "not",
                "why": f"the `{preset}` preset has no `flash.leaderboard` block "
                "(config/stages/flash.yaml)",
                "how": GPU_RUN,
            }
    return out


def leaderboard_sentences(ok: pd.DataFrame, compiled: bool, peak: float | None) -> list[str]:
    """Our time at the leaderboard point (`ok`: its trusted rows by implementation) against
    each SDPA backend's, and our TFLOP/s against the bf16 matmul `peak` of the ceilings stage;
    `compiled`: by the leaderboard's own compiled measurement."""
    ours = leaderboard_ms(ok, "flash_triton", compiled)
    if ours is None:
        return []
    how = (
        "the leaderboard's measurement (torch.compile, forward and backward of o.sum())"
        if compiled
        else "forward+backward"
    )
    sentences = [f"Ours: {ours:.2f} ms by {how}."]
    for other in ("sdpa_flash", "sdpa_cudnn"):
        if (theirs := leaderboard_ms(ok, other, compiled)) is not None:
            sentences.append(
                f"{IMPL_LABELS[other]} takes {theirs:.2f} ms: ours is {ours / theirs:.2f}× "
                f"its time ({'ours is faster' if ours < theirs else 'it is faster'})."
            )
    tfl = ok.loc["flash_triton"].get("lb_tflops" if compiled else "fwd_bwd_tflops")
    if peak and tfl == tfl:
        sentences.append(
            f"At {sig(tfl)} TFLOP/s (nominal FLOPs: 3.5× the causal forward's 2·n²·d per head) "
            f"ours runs at {tfl / peak:.0%} of the {sig(peak)} TFLOP/s bf16 matmul peak "
            "measured by the ceilings stage on this machine."
        )
    return sentences


def target_missing(t: pd.DataFrame, missing: list[str]) -> str:
    """Why the target's rows `t` give no comparison: `missing` has no successful point."""
    reasons = sorted(set(t.loc[t["impl"].isin(missing), "status"].astype(str)))
    return (
        f"No comparison: no successful points of {', '.join(IMPL_LABELS[m] for m in missing)}"
        + (f" ({'; '.join(reasons)})" if reasons else "")
        + "."
    )


def target_sentences(points: list[dict]) -> list[str]:
    """Where the target holds and where not (rows.py: `target_points`), and how the times and
    ratios were taken."""
    met = [p for p in points if p["verdict"] == "met"]
    missed = [p for p in points if p["verdict"] == "not met"]
    suspect = sum(p["verdict"] == "suspect" for p in points)
    out = []
    judged = len(met) + len(missed)
    if judged:
        out.append(
            f"The target holds at {len(met)} of {judged} points"
            + (f"; not at {', '.join(map(_at, missed))}" if missed else "")
            + f"{sanity.excluded(suspect)}."
        )
    elif suspect:
        out.append(f"No point can be judged{sanity.excluded(suspect)}.")
    n_rounds = sorted({len(p["each"]) for p in points if p["each"]})
    if n_rounds:
        unpaired = sum(not p["each"] for p in points)
        out.append(
            f"Times and ratios: the median of {'/'.join(map(str, n_rounds))} rounds in"
            " which ours and cuDNN's forward+backward ran back to back on the same inputs (the"
            " order alternating), so that a drift of the host falls on both; `rounds` spans the"
            " rounds' ratios, `single windows` is the ratio of the two implementations' own"
            " measurements, taken seconds apart"
            + (f" ({unpaired} of {len(points)} points without paired rounds, judged on those)"
               if unpaired else "") + "."
        )  # fmt: skip
    return out


def _at(p: dict) -> str:
    return f"d={p['d']} n={p['n']} ({ratio(p['ratio'])}×)"
