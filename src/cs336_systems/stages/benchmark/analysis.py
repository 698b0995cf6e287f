"""Report context and figures for the `benchmark` stage (questions 1-4)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from cs336_systems.core.costs import PATH_LABEL
from cs336_systems.reporting import questions, sanity
from cs336_systems.reporting.analysis import (
    SIZE_ORDER,
    failed_points,
    fmt,
    load,
    mark_suspect,
    md_table,
    ok,
    ordered_sizes,
    pct,
    plot_main,
    plural,
    ran,
    sig,
    size_key,
    sort_sizes,
)
from cs336_systems.stages.benchmark import answers
from cs336_systems.stages.benchmark.figures import plot
from cs336_systems.stages.benchmark.rows import (
    MODE_LABEL,
    WHY_FIRST_STEP,
    _eager_naive,
    backward_ratios,
    load_all_engines,
    load_benchmark,
    speedups,
    warmup_summary,
)
from cs336_systems.stages.benchmark.tables import engines_table

# how other readers (the comparison report) read this stage's CSVs
LOADERS = {"benchmark": load_benchmark}


PHASE_CONTEXT = 512  # the 2026 handout: "use context length 512 unless otherwise specified"


def phase_summary(df: pd.DataFrame, d: pd.DataFrame, hb: pd.DataFrame | None = None) -> dict:
    """2026's benchmarking question: forward, backward and optimizer step of a training step
    (eager, naive attention), for every size of the rows' edition at context 512 (the context
    nearest 512 where none ran at 512); a size without a measured step says why. A host-bound
    size (`hb`, answers.host_bound) is kept in the table but out of the backward/forward ratio:
    its passes' times are the host's."""
    t_all = _eager_naive(df[df["mode"] == "train_step"])
    if "fwd_ms_median" not in df or not len(t_all):
        return {}
    contexts = sorted(set(t_all["context_length"]))
    ctx = min(contexts, key=lambda c: (abs(c - PHASE_CONTEXT), c))
    editions = sorted({int(e) for e in df.get("edition", pd.Series(dtype=float)).dropna()})
    from cs336_systems.model import size_names

    names = size_names(editions[0]) if len(editions) == 1 else sorted(set(df["size"]))
    t = _eager_naive(d[(d["mode"] == "train_step") & (d["context_length"] == ctx)])
    out = {"context": ctx, "edition": editions[0] if len(editions) == 1 else None, "tables": {}}
    # core/harness.py StepClock: CUDA events on a GPU, the host clock on a CPU
    cuda = "device" in t_all and (t_all["device"].astype(str) == "cuda").any()
    out["clock"] = "CUDA events on the device" if cuda else "the host clock"
    out["sentences"] = []
    for prec in [p for p in ("fp32", "bf16") if p in set(t_all["precision"])]:
        rows = []
        g = t[t["precision"] == prec].set_index("size")
        every = t_all[(t_all["precision"] == prec) & (t_all["context_length"] == ctx)]
        every = every.set_index("size")
        for size in ordered_sizes([n for n in names if n != "tiny" or n in set(df["size"])]):
            if size in g.index:
                r = g.loc[size]
                rows.append(
                    {
                        "size": size,
                        "forward (ms)": fmt(r.fwd_ms_median, 2),
                        "backward (ms)": fmt(r.bwd_ms_median, 2),
                        "optimizer (ms)": fmt(r.opt_ms_median, 2),
                        "step (ms)": fmt(r.step_ms_median, 2),
                        "optimizer share": pct(r.opt_ms_median / r.step_ms_median),
                    }
                )
            else:
                why = str(every.loc[size, "status"]) if size in every.index else "not run"
                if why == "ok":  # ran, but failed a sanity check
                    why = "⚠ suspect (see Suspect numbers): left out"
                rows.append({"size": size, "forward (ms)": why})
        out["tables"][prec] = md_table(pd.DataFrame(rows).fillna("–"))
        if len(g):
            share = g["opt_ms_median"] / g["step_ms_median"]
            host = set()
            if hb is not None and len(hb):
                at = hb[(hb["context_length"] == ctx) & (hb["precision"] == prec)]
                host = set(at[(at["compile"] == "eager") & (at["attention"] == "naive")]["size"])
                host &= set(g.index)
            kept = g.drop(index=[x for x in g.index if x in host])
            ratio = kept["bwd_ms_median"] / kept["fwd_ms_median"]
            left = (
                f" ({', '.join(f'`{x}`' for x in sorted(host))} left out: host-bound, see below)"
                if host
                else ""
            )
            parts = g["fwd_ms_median"] + g["bwd_ms_median"] + g["opt_ms_median"]
            off, clause = _passes_disagree(d, prec, ctx, ratio)
            ratio, left = ratio.drop(index=off), left + clause
            out["sentences"].append(
                f"{prec}: the optimizer step takes {_spread(share, pct)} of the training step, "
                ""
                + (
                    f"backward {_spread(ratio, lambda v: f'{v:.2f}×')} the forward time{left}, "
                    if len(ratio)
                    else f"backward/forward not given{left}, "
                )
                + "and the "
                f"three phases add up to {_spread(parts / g['step_ms_median'], pct)} of the "
                "whole step (medians; the rest is zeroing the gradients and the synchronization "
                "around the step)"
            )
    return out


# the in-step phases' backward/forward and Q1's (its passes in runs of their own) differ by
# more than this at a size: both are shown, neither stands for the other
PASSES_DISAGREE = 0.2


def _passes_disagree(d: pd.DataFrame, prec: str, ctx: int, ratio: pd.Series):
    """The sizes where Q1's backward/forward (forward+backward minus forward, runs of their
    own) and the in-step phases' differ by more than PASSES_DISAGREE, and a clause naming both
    and which pass parts: each pass in the step against Q1's, and the other precision's forward
    at the same size for contrast."""
    q1 = _eager_naive(backward_ratios(d))
    q1 = q1[q1["context_length"] == ctx].set_index(["precision", "size"])
    mine = q1.loc[prec] if prec in q1.index.get_level_values(0) else q1.iloc[:0]
    off = [
        x
        for x in ratio.index
        if x in mine.index and abs(ratio[x] / mine.loc[x, "ratio"] - 1) > PASSES_DISAGREE
    ]
    if not off:
        return [], ""
    each = ", ".join(
        f"`{x}` {ratio[x]:.2f}× in the step, {mine.loc[x, 'ratio']:.2f}× in Q1" for x in off
    )
    step = _eager_naive(ran(d))
    step = step[(step["mode"] == "train_step") & (step["context_length"] == ctx)]
    step = step.set_index(["precision", "size"])
    passes = []
    for x in off:
        if (prec, x) not in step.index:
            continue
        r, q = step.loc[(prec, x)], mine.loc[x]
        text = (
            f"`{x}`: forward {fmt(r['fwd_ms_median'])} ms in the step against "
            f"{fmt(q['forward_ms'])} in Q1's forward run ({r['fwd_ms_median'] / q['forward_ms']:.2f}×), "
            f"backward {fmt(r['bwd_ms_median'])} against {fmt(q['backward_ms'])} "
            f"({r['bwd_ms_median'] / q['backward_ms']:.2f}×)"
        )
        other = next((o for o in ("fp32", "bf16") if o != prec and (o, x) in step.index), None)
        if other and (other, x) in q1.index:
            f_o = step.loc[(other, x), "fwd_ms_median"] / q1.loc[(other, x), "forward_ms"]
            text += f"; {other}'s forward {f_o:.2f}× its Q1 run's"
        passes.append(text)
    return off, (
        f" (left out where Q1's passes, each timed in runs of its own, disagree by more than "
        f"{PASSES_DISAGREE:.0%}: {each}"
        + (f"; per pass, {'; '.join(passes)}" if passes else "")
        + "; neither timing checks the other, and what makes them part was not measured)"
    )


def _latency_table(df: pd.DataFrame, precision: str) -> str:
    """Every eager point that ran, suspect ones marked."""
    d = _eager_naive(ran(df))
    d = d[d["precision"] == precision]
    if len(d) == 0:
        return ""
    flags = sanity.is_suspect(d)
    d = d.assign(
        cell=[
            mark_suspect(f"{fmt(m)} ± {fmt(s)}", bool(f))
            for m, s, f in zip(d.step_ms_mean, d.step_ms_std, flags, strict=True)
        ]
    )
    t = d.pivot_table(
        index=["size", "context_length"], columns="mode", values="cell", aggfunc="first"
    )
    t = t.reset_index()
    t = sort_sizes(t, "context_length")
    t.columns.name = None
    t = t.rename(columns={m: f"{MODE_LABEL[m]} (ms)" for m in MODE_LABEL})
    return md_table(t)


def protocol_sentence(warmup: int, measured: int, df: pd.DataFrame) -> str:
    """The run's step counts against the handout's (5 and 10), and why a preset departs."""
    want = questions.PROTOCOL["benchmark"]
    if (warmup, measured) == (want["warmup_steps"], want["measure_steps"]):
        return "the handout's protocol"
    preset = str(df["preset"].iloc[0]) if "preset" in df else "?"
    why = questions.PROTOCOL_WHY.get(preset, f"the `{preset}` preset's config sets them")
    return (
        f"the handout asks {want['warmup_steps']} and {want['measure_steps']}; this run takes "
        f"fewer because {why}"
    )


def _spread(values: pd.Series, show) -> str:
    """The median of `values` per size, with its range where there are several."""
    if len(values) == 1:
        return f"{show(values.iloc[0])} (`{values.index[0]}`)"
    return (
        f"{show(values.median())} (median; {show(values.min())} at `{values.idxmin()}` to "
        f"{show(values.max())} at `{values.idxmax()}`)"
    )


def _range_sentence(values: pd.Series, what: str) -> str:
    """'1.20× (0.94–1.70× across 3 points)'; one value: '1.41× (one point)' (`what` singular)."""
    if len(values) == 1:
        return f"{values.iloc[0]:.2f}× (one {what})"
    return (
        f"{values.median():.2f}× ({values.min():.2f}–{values.max():.2f}× across "
        f"{plural(len(values), what)})"
    )


def context(results_dir: Path) -> dict:
    df = load_benchmark(results_dir)
    w = load(results_dir, "benchmark_warmup")
    s: dict = {"available": len(df) > 0}
    if not s["available"]:
        return s
    d = ok(df)
    s["n_points"] = len(df)
    e = engines_table(load_all_engines(results_dir))
    s["engines_table"] = md_table(e) if len(e) else ""
    s["n_ok"] = len(ran(df))
    s["n_suspect"] = sanity.n_suspect(ran(df))
    s["statuses"] = df["status"].value_counts().to_dict()
    s["failed_table"] = (
        md_table(
            sort_sizes(
                failed_points(
                    df, ["size", "context_length", "mode", "precision", "compile", "attention"]
                )
            )
        )
        if len(ran(df)) < len(df)
        else ""
    )
    s["sizes"] = [x for x in SIZE_ORDER if x in set(df["size"])]
    s["contexts"] = sorted(set(df["context_length"]))
    s["batch_size"] = int(df["batch_size"].iloc[0])
    s["warmup_steps"] = int(df["warmup_steps"].iloc[0])
    s["measure_steps"] = int(df["measure_steps"].iloc[0])
    s["protocol"] = protocol_sentence(s["warmup_steps"], s["measure_steps"], df)
    s["latency_fp32"] = _latency_table(df, "fp32")
    s["latency_bf16"] = _latency_table(df, "bf16")
    pairs = answers.host_bound(d) if "peak_tflops" in d else pd.DataFrame()
    s["host_bound"] = answers.host_bound_note(pairs)
    hb = answers.host_bound_points(ran(df), pairs)  # every pass and precision of those points
    s["phases"] = phase_summary(df, d, hb)
    s["pass_times"] = answers.pass_times(d)
    s["variability"] = answers.variability(d, s["measure_steps"], answers.device_of(df))

    # Q1: backward vs forward (a point whose forward or forward+backward is suspect drops out,
    # and so does a host-bound one: its ratio is the host's)
    r = backward_ratios(_eager_naive(d))
    dropped = backward_ratios(_eager_naive(ran(df)))
    if len(hb) and len(r):
        keys = ["size", "context_length", "precision", "compile", "attention"]
        hit = r.merge(hb[keys].drop_duplicates(), on=keys, how="left", indicator=True)
        r = r[(hit["_merge"] != "both").to_numpy()]
    s["bwd"] = {}
    for prec, g in r.groupby("precision"):
        n_out = int((dropped["precision"] == prec).sum()) - len(g)
        s["bwd"][prec] = _range_sentence(g["ratio"], "size/context point") + (
            f" ({plural(n_out, 'point')} left out: suspect or host-bound)" if n_out else ""
        )
    if len(r) > 1:
        hi = r.loc[r["ratio"].idxmax()]
        lo = r.loc[r["ratio"].idxmin()]
        s["bwd_extremes"] = (
            f"the largest ratio is {hi.ratio:.2f}× ({hi['size']}, context {hi.context_length}, "
            f"{hi.precision}) and the smallest {lo.ratio:.2f}× ({lo['size']}, context "
            f"{lo.context_length}, {lo.precision})"
        )

    # Q2: warm-up
    ws = warmup_summary(w) if len(w) else pd.DataFrame()
    s["warmup"] = []
    for size, g in ws.groupby("size") if len(ws) else []:
        g = g.set_index("warmup_steps").sort_index()
        entry = {
            "size": size,
            "table": md_table(
                g.reset_index()[
                    ["warmup_steps", "mean_ms", "std_ms", "median_ms", "first_measured_ms"]
                ]
            ),
        }
        if 0 in g.index:
            z = g.loc[0]
            entry["first_ratio"] = z.first_measured_ms / z.median_ms
            entry["sentence0"] = (
                f"With no warm-up, the first measured step of `{size}` takes "
                f"{z.first_measured_ms:.1f} ms, {entry['first_ratio']:.1f}× the median step "
                f"({z.median_ms:.1f} ms); the std over the measured steps is {z.std_ms:.2f} ms "
                f"(mean {z.mean_ms:.1f} ms)."
            )
            for k in sorted(i for i in g.index if i > 0):
                row = g.loc[k]
                change = 1 - row.std_ms / z.std_ms if z.std_ms > 0 else float("nan")
                entry.setdefault("after", []).append(
                    f"with {k} warm-up step{'s' if k > 1 else ''} the std is {row.std_ms:.2f} ms "
                    f"({'−' if change >= 0 else '+'}{abs(100 * change):.1f}%) and the mean {row.mean_ms:.1f} ms"
                )
        entry["why"] = WHY_FIRST_STEP.get(str(w["device"].iloc[0]), WHY_FIRST_STEP["cpu"])
        entry["few"] = answers.warmup_after(g, answers.device_of(w))
        s["warmup"].append(entry)

    # Q3: bf16 and compile speedups, each point against itself (same size, context, mode and
    # attention); the headline over naive attention, the model the handout benchmarks
    a = ran(df)
    naive, naive_all = d[d["attention"] == "naive"], a[a["attention"] == "naive"]
    bf = speedups(naive[naive["compile"] == "eager"], "precision", "fp32", "bf16")
    bf_all = speedups(naive_all[naive_all["compile"] == "eager"], "precision", "fp32", "bf16")
    s["bf16"] = _speedup_summary(
        bf, "bf16 autocast over fp32 (eager, naive attention, each point against itself)",
        len(bf_all) - len(bf),
    )  # fmt: skip
    s["bf16"]["trend"] = answers.speedup_trend(bf)
    other = speedups(d[(d["compile"] == "eager") & (d["attention"] != "naive")], "precision",
                     "fp32", "bf16")  # fmt: skip
    s["bf16"]["others"] = "; ".join(
        f"{att} attention: {_range_sentence(g['speedup'], 'point')}"
        for att, g in other.groupby("attention")
    )
    cp = speedups(naive, "compile", "eager", "compiled")
    cp_all = speedups(naive_all, "compile", "eager", "compiled")
    s["compile"] = _speedup_summary(
        cp, "torch.compile over eager (naive attention, each point against itself)",
        len(cp_all) - len(cp),
    )  # fmt: skip

    # Q4: MFU, from points that passed the checks, against the ceiling of the model's path
    missing = sorted(
        {
            f"{p}: {str(path).removeprefix('missing: ')}"
            for p, path in zip(ran(df)["precision"], ran(df)["peak_path"], strict=True)
            if str(path).startswith("missing")
        }
    )
    s["mfu_missing"] = missing
    s["mfu_paths"] = sorted(
        {
            f"{p}: {PATH_LABEL.get(path, path)}"
            for p, path in zip(ran(df)["precision"], ran(df)["peak_path"], strict=True)
            if not str(path).startswith("missing")
        }
    )
    n_mfu_suspect = int((sanity.is_suspect(ran(df)) & ran(df)["tflops"].notna()).sum())
    if "mfu" in d and d["mfu"].notna().any():
        best = d.loc[d["mfu"].idxmax()]
        s["mfu_best"] = (
            f"{pct(best.mfu)} MFU ({sig(best.tflops)} TFLOP/s of a measured "
            f"{sig(best.peak_tflops)} TFLOP/s through "
            f"{PATH_LABEL.get(best.peak_path, best.peak_path)}) "
            f"for `{best['size']}` at context {best.context_length}, {MODE_LABEL[best['mode']]}, "
            f"{best.precision}, {best['compile']}" + sanity.excluded(n_mfu_suspect)
        )
        t = d[(d["mode"] == "train_step") & d["mfu"].notna()]
        s["mfu_over"] = ""
        if len(t):
            m = t.pivot_table(
                index="size", columns=["precision", "compile"], values="mfu", aggfunc="max"
            )
            m = m.reindex(ordered_sizes(m.index))
            m.columns = [f"{p} {c}" for p, c in m.columns]
            m = m.map(lambda v: "–" if pd.isna(v) else f"{100 * v:.1f}")
            s["mfu_table"] = md_table(m.reset_index())
            s["mfu_over"] = ", ".join(sorted(set(t["attention"].astype(str))))
        else:  # every training step failed a sanity check (or none ran): say so, draw nothing
            s["mfu_table"] = (
                "_No training step has an MFU to show" + sanity.excluded(n_mfu_suspect) + "._"
            )
        s["mfu_goal"] = answers.goal_breakdown(d, load(results_dir, "ceilings"))
    return s


def _speedup_summary(sp: pd.DataFrame, what: str, n_excluded: int = 0) -> dict:
    if len(sp) == 0:
        return {
            "sentence": f"No pairs of points to compare for {what}"
            + sanity.excluded(n_excluded, "pair")
            + ".",
            "losers": "",
            "table": "",
        }
    out = {}
    per_size = sp.groupby(["size", "mode"], as_index=False)["speedup"].median()
    per_size = per_size.sort_values(
        ["size", "mode"], key=lambda c: size_key(c) if c.name == "size" else c
    )
    t = per_size.pivot(index="size", columns="mode", values="speedup")
    t = t.reindex([x for x in SIZE_ORDER if x in t.index])
    t.columns = [MODE_LABEL.get(c, c) for c in t.columns]
    out["table"] = md_table(t.reset_index())
    excluded = sanity.excluded(n_excluded, "pair")
    out["sentence"] = (
        f"{what}: {_range_sentence(sp['speedup'], 'point')} (median, range"
        + excluded.replace(" (", "; ", 1).removesuffix(")")
        + ")."
        if len(sp) > 1
        else f"{what}: {_range_sentence(sp['speedup'], 'point')}{excluded}."
    )
    losers = sp[sp["speedup"] < 1.0]
    if len(losers):
        # the attention names the point where a size, context and mode repeat across attentions
        many = "attention" in losers and losers["attention"].nunique() > 1
        items = ", ".join(
            f"{r['size']} ctx {r.context_length} {MODE_LABEL[r['mode']]}"
            + (
                f" ({r['attention']} attention, {r.speedup:.2f}×)"
                if many
                else f" ({r.speedup:.2f}×)"
            )
            for _, r in sort_sizes(losers).head(8).iterrows()
        )
        where = (
            "any measured point"
            if len(losers) == len(sp)
            else f"{plural(len(losers), 'point')} of {len(sp)}"
        )
        out["losers"] = f"It does not pay (speedup below 1) at {where}: {items}."
    else:
        out["losers"] = "It pays at every measured point."
    return out


__all__ = [
    "plot",
    "context",
    "backward_ratios",
    "speedups",
    "warmup_summary",
    "load_benchmark",
    "fmt",
    "math",
]


if __name__ == "__main__":
    plot_main(plot)
