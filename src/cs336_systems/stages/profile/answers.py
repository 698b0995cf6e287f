"""The profile section's answers in words: the contexts the probe found, the profiled forward
against the harness's time at every profiled point (nsys_profile (a)), the kernel that takes
the most time (Q6), the non-GEMM kernels of forward (Q7), the GEMM share and how the other
kernel classes' shares move from a forward pass to a training step (Q8; (d): "how about other
kernels?"), and inside attention (Q9) softmax against the matmuls, and which units ran the
matmuls, by kernel name."""

from __future__ import annotations

import pandas as pd

from cs336_systems.core.costs import SOFTMAX_FLOPS_PER_ELEMENT
from cs336_systems.profiling.kernel_classes import KERNEL_CLASSES
from cs336_systems.reporting.analysis import pct

# the profiled forward "matches" the harness's within this share
MATCH = 0.10


def probe_sentences(probe: pd.DataFrame) -> list[str]:
    """Per size: the contexts the probe tried with their status, its result and the grid."""
    out = []
    if probe.empty or "context_length" not in probe:
        return out
    for size, g in probe.groupby("size", sort=False):
        g = g.dropna(subset=["context_length"]).sort_values("context_length")
        if g.empty:
            continue
        tried = ", ".join(f"{int(r['context_length'])} {r['status']}" for _, r in g.iterrows())
        r = g.iloc[-1]
        largest = r["largest_fitting"]
        found = f"the largest that fits is {int(largest)}" if pd.notna(largest) else "none fits"
        why = "the cap" if r["stopped_by"] == "cap" else "the first failure"
        out.append(
            f"{size}: one {r['probe_mode']} step per context, doubling from "
            f"{int(r['probe_start'])} up to {int(r['probe_cap'])} ({tried}); {found} (stopped by "
            f"{why}), so the profiled contexts are {r['grid_contexts']}."
        )
    return out


def harness_sentence(h: pd.DataFrame, kernel_word: str) -> tuple[str, dict]:
    """(the sentence, a coverage note where some point has no harness time)."""
    if h.empty:  # no forward point ran and passed the checks (suspect ones are left out)
        why = "no profiled forward point ran and passed the sanity checks"
        how = "a rerun on an idle machine (the suspect rows say why each was flagged)"
        return (
            f"_{why[0].upper()}{why[1:]} (see Suspect numbers), so nothing is compared with "
            "the harness._",
            {"nsys_profile.a": {"status": "partly", "why": why, "how": how}},
        )
    cov: dict = {}
    hh = h.dropna(subset=["harness_ms"])
    if len(hh):
        r = hh["profiled_over_harness"]
        close = (r - 1).abs() <= MATCH
        where = f"every one of the {len(h)}" if len(hh) == len(h) else f"{len(hh)} of the {len(h)}"
        own = (hh["harness_from"] == "this job").all()
        sentence = (
            f"At {where} profiled forward point{'s' if len(h) > 1 else ''} the harness's time "
            + (
                "was measured by the profile job itself, before its capture (the benchmark's "
                "method and step counts)"
                if own
                else "comes from the benchmark stage's same point"
            )
            + f": the step timed under the profiler takes {r.median():.2f}× it (median; "
            f"{r.min():.2f}–{r.max():.2f}×), within ±{MATCH:.0%} at {int(close.sum())} of "
            f"{len(hh)}, and the summed {kernel_word} time is "
            f"{hh['kernel_over_harness'].median():.2f}× it ("
            f"{hh['kernel_over_harness'].min():.2f}–{hh['kernel_over_harness'].max():.2f}×). "
            + (
                "So the profiled forward matches the Python timing"
                if close.all()
                else "So the profiled forward does not match the Python timing everywhere"
            )
            + _harness_why(hh, kernel_word)
        )
        if len(hh) < len(h):
            cov = {
                "nsys_profile.a": {
                    "status": "partly",
                    "why": f"{len(h) - len(hh)} profiled forward point(s) have no harness time",
                    "how": "the profile stage's `harness` block (config/stages/profile.yaml)",
                }
            }
    else:
        sentence = (
            "Neither the profile job (its `harness` block) nor the benchmark stage timed these "
            "forward points outside the profiler, so only the profiled times are shown."
        )
        cov = {
            "nsys_profile.a": {
                "status": "partly",
                "why": "no harness time at the profiled points",
                "how": "the profile stage's `harness` block (config/stages/profile.yaml)",
            }
        }

    return sentence, cov


def _at(rows: pd.DataFrame, col: str) -> str:
    """Each row as "`size` at context (its `col`×)", joined."""
    return ", ".join(
        f"`{r['size']}` at {int(r['context_length'])} ({r[col]:.2f}×)" for _, r in rows.iterrows()
    )


def _span(x: pd.Series) -> str:
    return f"{x.min():.2f}×" if x.min() == x.max() else f"{x.min():.2f}–{x.max():.2f}×"


def _harness_why(hh: pd.DataFrame, kernel_word: str) -> str:
    """After "So the profiled forward ...": where it is off the harness's, each direction
    explained only by what its numbers allow (longer: the profiler's recording; shorter:
    unexplained, the profiler only adds work), then the summed kernel time (_kernel_fit)."""
    r = hh["profiled_over_harness"]
    off = []
    if (r > 1 + MATCH).any():
        off.append(
            f"longer under the profiler at {_at(hh[r > 1 + MATCH], 'profiled_over_harness')}, "
            f"where its own work (recording every {kernel_word} and range) lengthens the step"
        )
    if (r < 1 - MATCH).any():
        off.append(
            f"shorter at {_at(hh[r < 1 - MATCH], 'profiled_over_harness')}, faster under the "
            "profiler, which only adds work: unexplained"
        )
    fit = _kernel_fit(hh.dropna(subset=["kernel_ms", "profiled_step_ms"]), kernel_word)
    return (": " + "; ".join(off) if off else "") + "." + (" " + fit if fit else "")


def _kernel_fit(hh: pd.DataFrame, kernel_word: str) -> str:
    """The summed kernel time against the profiled step it ran in (the rest: the host's gaps)
    and, flagged, wherever it alone outlasts a whole step: the profiled one (a sum of
    durations exceeds the wall time only where they overlap) or the harness's."""
    if hh.empty:
        return ""
    hh = hh.assign(fit=hh["kernel_ms"] / hh["profiled_step_ms"])
    text = f"The summed {kernel_word} time " + (
        f"fits in the profiled step at every point ({_span(hh['fit'])} it), leaving out the "
        f"host's gaps between {kernel_word}s"
        if (hh["fit"] <= 1).all()
        else f"outlasts the profiled step it ran in at {_at(hh[hh['fit'] > 1], 'fit')}, "
        f"**suspect**: summed {kernel_word} times exceed their step only where they overlap"
    )
    over = hh[hh["kernel_over_harness"] > 1]
    longer = over["profiled_over_harness"] > 1 + MATCH  # the profiler lengthened that step
    if longer.any():
        text += (
            f"; at {_at(over[longer], 'kernel_over_harness')} it alone outlasts the harness's "
            f"whole step, as the profiler's recording lengthens each {kernel_word} too"
        )
    if (~longer).any():
        text += (
            f"; at {_at(over[~longer], 'kernel_over_harness')} it alone outlasts the harness's "
            f"whole step though the profiled step does not: the {kernel_word}s themselves ran "
            "slower in the profiled run, which no gap between them explains (**suspect**)"
        )
    return text + "."


def _q1_why(r: pd.Series, kernel_word: str) -> str:
    """Why one profiled forward differs from Q1's same point, from its numbers."""
    k, q, prof = r["kernel_ms"], r["q1_ms"], r["profiled_step_ms"]
    head = (
        f"`{r['size']}` at {int(r['context_length'])}: {prof:.2f} ms profiled against Q1's "
        f"{q:.2f} ms ({prof / q:.2f}×)"
    )
    if k > q * (1 + MATCH):
        return head + (
            f", **suspect**: its {kernel_word}s alone take {k:.2f} ms, more than Q1's whole "
            "step, so the two runs did not do the same device work"
        )
    if prof < q:
        return head + (
            f", faster under the profiler, which only adds work: unexplained, Q1's step "
            f"varied by {r['q1_std_ms']:.2f} ms (std)"
        )
    text = head + (
        f": its {kernel_word}s take {k:.2f} ms, which fit in Q1's step, so the "
        f"{prof - q:.2f} ms more is host time (the GPU idles {pct(1 - k / prof)} of the "
        f"profiled step against {pct(max(0.0, 1 - k / q))} of Q1's)"
    )
    if r.get("host_bound") == "yes":
        text += "; the point is host-bound by the rule, so slower launches lengthen it"
    own = r.get("harness_ms")
    if r.get("harness_from") == "this job" and pd.notna(own) and abs(own / prof - 1) <= MATCH:
        text += (
            f"; the profile job's own timing before its capture took {own:.2f} ms too, so its "
            "process (nsys attached, the annotated attention's ranges) launches slower, not "
            "the capture"
        )
    return text


def q1_sentence(h: pd.DataFrame, kernel_word: str) -> str:
    """nsys_profile (a) against Q1: each profiled forward beside the benchmark's harness time of
    the same point (with_q1), how many agree within ±MATCH, and each that does not, explained
    from its numbers or flagged; the host-bound rule's verdict on the points it can test."""
    hh = h.dropna(subset=["q1_ms"]) if "q1_ms" in h else h.iloc[:0]
    if not len(hh):
        return (
            "Q1 (the benchmark stage) did not time these forward points (other contexts or "
            "sizes), so they are compared with the profile job's own harness timing only."
        )
    r = hh["profiled_over_q1"]
    close = (r - 1).abs() <= MATCH
    text = (
        f"Against Q1's harness time of the same point ({len(hh)} of the {len(h)} profiled "
        f"forwards), the profiled forward takes {r.median():.2f}× it"
        + (f" (median; {r.min():.2f}–{r.max():.2f}×)" if len(r) > 1 else "")
        + (
            f", within ±{MATCH:.0%} at {int(close.sum())} of {len(r)}"
            if len(r) > 1
            else f", {'within' if close.all() else 'outside'} ±{MATCH:.0%}"
        )
    )
    # beyond ±MATCH, or whose kernels alone outlast Q1's whole step (a check at every point)
    off = hh[~close | (hh["kernel_ms"] > hh["q1_ms"] * (1 + MATCH))]
    if len(off):
        text += ". Apart: " + "; ".join(_q1_why(x, kernel_word) for _, x in off.iterrows())
    tested_ = hh[hh["host_bound"] != "untested"]
    if len(tested_):
        n = int((tested_["host_bound"] == "yes").sum())
        text += (
            f". The host-bound rule (the benchmark's fp32/bf16 pair of the point) fires at {n} "
            f"of the {len(tested_)} points it can test"
        )
    return text + "."


def _move(f: float, t: float) -> str:
    return "rises" if t > f * 1.1 else "falls" if t < f / 1.1 else "stays"


def other_kernels(kernels: pd.DataFrame, unit: str) -> str:
    """Each kernel class but GEMM: its median share of a forward pass's and of a training
    step's time (the whole step's kernels), which way it moves, and why (_moves_why)."""
    k = kernels[(kernels["phase"] == "step") & kernels["mode"].isin(["forward", "train_step"])]
    if k.empty:
        return ""
    per = k.groupby(["size", "context_length", "mode", "kernel_class"])["ms_per_step"].sum()
    share = per / per.groupby(["size", "context_length", "mode"]).transform("sum")
    med = share.groupby(["mode", "kernel_class"]).median().unstack("mode").fillna(0.0)
    if not {"forward", "train_step"} <= set(med.columns):
        return ""
    parts = []
    for cls in [c for c in KERNEL_CLASSES if c != "gemm" and c in med.index]:
        f, t = med.loc[cls, "forward"], med.loc[cls, "train_step"]
        if max(f, t) < 0.005:
            continue
        parts.append(f"{cls} {pct(f)} → {pct(t)} ({_move(f, t)})")
    if not parts:
        return ""
    return (
        f"The other kernel classes' median shares of {unit}, forward → training step: "
        + "; ".join(parts)
        + ". "
        + _moves_why(kernels, med)
    )


def _moves_why(kernels: pd.DataFrame, med: pd.DataFrame) -> str:
    """Why the elementwise and reduction shares move, as far as the numbers show it: a class
    that rises, by where its training-step time runs (_phase_split); else the GEMM share beside
    them, and where it grows, backward's two matmuls per forward matmul."""
    rise = [
        c
        for c in ("elementwise", "reduction")
        if c in med.index and _move(*med.loc[c, ["forward", "train_step"]]) == "rises"
    ]
    if rise:
        text = " ".join(_phase_split(kernels, c) for c in rise)
    else:
        f, t = med.loc["gemm", ["forward", "train_step"]] if "gemm" in med.index else (0.0, 0.0)
        text = (
            f"Neither elementwise nor reduction rises in the step; GEMMs go {pct(f)} → {pct(t)}"
            + (
                ": backward's matmuls (two per forward matmul) outgrow its elementwise and "
                "reduction gradients"
                if t > f
                else ""
            )
            + "."
        )
    if "optimizer" in med.index and med.loc["optimizer", "train_step"] >= 0.005:
        text += " The optimizer class is the update over every parameter, run only in the step."
    return text


def _phase_split(kernels: pd.DataFrame, cls: str) -> str:
    """A rising class: the median share of its training-step time in the optimizer and in
    backward, the larger first."""
    k = kernels[(kernels["mode"] == "train_step") & (kernels["kernel_class"] == cls)]
    t = k.pivot_table(
        index=["size", "context_length"], columns="phase", values="ms_per_step", aggfunc="sum"
    )
    shares = {
        what: float((t[phase].fillna(0.0) / t["step"]).median()) if phase in t else 0.0
        for phase, what in (
            ("optimizer", "the optimizer's update"),
            ("backward", "backward's gradients"),
        )
    }
    big = [(w, v) for w, v in sorted(shares.items(), key=lambda x: -x[1]) if v >= 0.005]
    if not big:
        return f"The {cls} share rises, though neither backward nor the optimizer runs it."
    return (
        f"The {cls} share rises: {pct(big[0][1])} of its training-step time is {big[0][0]}"
        + "".join(f" and {pct(v)} {w}" for w, v in big[1:])
        + " (median over points)."
    )


def matmul_sentence(units: dict[str, dict], cpu_only: bool) -> str:
    """Where the attention matmuls ran, as their kernel names say, and why softmax is slow."""
    softmax_why = (
        "softmax reads and writes the whole n×n score matrix for a few FLOPs per element (an "
        "exp each), so it is bound by memory bandwidth, not by compute."
    )
    if cpu_only or set(units) <= {"CPU"}:
        return (
            "The matmuls run in optimized BLAS at high arithmetic intensity; softmax does a "
            "few FLOPs per element of the n×n score matrix, with an exp each, and streams the "
            "whole matrix through memory."
        )
    if not units:
        return softmax_why[0].upper() + softmax_why[1:]
    parts = []
    for unit, u in units.items():
        names = ", ".join(f"`{n}`" for n in u["kernels"])
        where = {
            "tensor cores": "on tensor cores",
            "CUDA cores": "on the CUDA cores as FFMA (fp32 without TF32: no tensor cores)",
            "unknown": "in kernels whose names do not say which units they use",
        }.get(unit, f"on {unit}")
        parts.append(f"{pct(u['share'])} of their GEMM time {where} ({names})")
    return (
        "By their kernel names, the attention matmuls run "
        + "; ".join(parts)
        + ", at high arithmetic intensity either way; "
        + softmax_why
    )


def top_sentence(
    fwd_top: pd.DataFrame, merged: pd.DataFrame, fb_what: str, kernel_word: str, unit: str
) -> str:
    """Q6: the class of forward's top kernel, the largest point's top kernel, and where it also
    tops forward+backward (`merged`: rows.top_merged)."""
    same = (merged["kernel_fwd"] == merged.get("kernel_fb")).sum()
    n_fb = merged.get("kernel_fb", pd.Series(dtype=str)).notna().sum()
    classes = fwd_top["kernel_class"].value_counts()
    big = fwd_top.iloc[-1]
    return (
        f"The {kernel_word} with the most {unit} in forward is of class "
        f"`{classes.index[0]}` in {classes.iloc[0]} of {len(fwd_top)} points; for "
        f"{big['size']} at context {big.context_length} it is `{big.kernel_short}` "
        f"({big.calls_per_step:.0f} calls per forward, {pct(big.share)} of forward time). "
        + (
            f"The same {kernel_word} tops {fb_what} in {same} of {n_fb} points."
            if n_fb
            else "No forward+backward or training-step points were profiled."
        )
    )


def nontrivial_sentence(
    nt: pd.DataFrame, share_non_gemm: float, kernel_word: str, threshold: str, unit: str
) -> str:
    """Q7: how many non-GEMM operations (kernels grouped by what they run) reach `threshold` of
    forward time, their share together and the largest."""
    top = nt.iloc[0]
    variants = (
        f", run by {int(top['kernels'])} {kernel_word}s" if int(top.get("kernels", 1)) > 1 else ""
    )
    return (
        f"{len(nt)} non-GEMM operations (their {kernel_word}s grouped by what they run, each "
        f"variant counted with its operation) reach {threshold} "
        f"of forward time in at least one of the {int(top['of_points'])} points; "
        f"together non-GEMM work is {pct(share_non_gemm)} of forward "
        f"{unit} (median over points). The largest is `{top['operation']}` "
        f"({top['class']}{variants}, median {pct(top['median_share'])}, at or above "
        f"{threshold} in {top['points_at_or_above']} of {top['of_points']} points)."
    )


def gemm_sentence(both: pd.DataFrame, unit: str) -> str:
    """Q8: the GEMM share of a forward pass against a training step's."""
    return (
        f"GEMMs take a median {pct(both['forward'].median())} of {unit} in a "
        f"forward pass and {pct(both['train_step'].median())} in a full training step "
        f"({len(both)} size/context points; forward-only above training step in "
        f"{int((both['forward'] > both['train_step']).sum())} of them)."
    )


def softmax_share_sentence(share: dict, kernel_word: str) -> str:
    """Attention's softmax's share of forward time with its variants counted as one operation
    (Q7's grouping, which counts the loss's log-softmax as cross-entropy), beside Q9's
    ranges."""
    if not share:
        return ""
    return (
        f"Counted as one operation ({share['kernels']} {kernel_word} variant"
        f"{'s' if share['kernels'] > 1 else ''}, grouped before the share is taken; the "
        "loss's log-softmax counts as cross-entropy), attention's softmax "
        f"takes a median {pct(share['median'])} of forward time ({pct(share['min'])}–"
        f"{pct(share['max'])} over {share['points']} points)."
    )


def attention_scale_note(cols: list[str]) -> str:
    """Q9: where the 1/sqrt(d) scaling is counted, when the table shows it."""
    return (
        "The 1/√d scaling of the scores is its own part (`scale`), not counted as matmul "
        "time: in captures whose annotated attention put it inside the QKᵀ range it is the "
        "non-GEMM work of that range."
        if "scale_ms" in cols
        else ""
    )


def attention_sentence(a: pd.DataFrame, units: dict[str, dict], cpu_only: bool) -> str:
    """Q9: softmax's time against the matmuls' beside its FLOPs against theirs, and why."""
    ratio = float(a["time_vs_flops"].median())
    per_flop = (
        f"per FLOP, softmax is {ratio:.0f}× slower"
        if ratio >= 1.5
        else (
            f"per FLOP, softmax is about as fast as the matmuls ({ratio:.2f}×)"
            if ratio > 0.67
            else f"per FLOP, softmax is faster than the matmuls ({ratio:.2f}×)"
        )
    )
    return (
        f"Inside forward attention, softmax takes {a['softmax_over_matmul_time'].median():.2f}× "
        f"the time of the two matmuls (median over {len(a)} points) while it has only "
        f"{a['softmax_over_matmul_flops'].median():.3f}× their FLOPs "
        f"({SOFTMAX_FLOPS_PER_ELEMENT} FLOPs per score against 4·d_head): {per_flop}. "
        + (
            matmul_sentence(units, cpu_only)
            if ratio >= 1.5
            else "At these sizes the matmuls are far from their peak too (small matrices: "
            "call overheads and low arithmetic intensity), so the FLOP ratio does not "
            "predict the time ratio."
        )
    )
