"""Report context and figures for the `ddp` stage (questions 23-27).

The bucket-size model (assignment's overhead equation): with total gradient bytes s, all-reduce
bandwidth w (algorithmic: message bytes / time), a fixed cost o per all-reduce call and n_b
equal buckets, and each bucket's gradient computation taking as long as its communication
(c = s / (n_b w)), bucket i is ready at i c and the communication stream falls behind by o per
call, so the last all-reduce ends at (n_b + 1) c + n_b o while backward ends at n_b c:

    overhead(n_b) = s / (n_b w) + n_b o,

minimized at n_b* = sqrt(s / (w o)), i.e. a bucket size b* = s / n_b* = sqrt(s w o), where the
overhead is 2 sqrt(s o / w). The predicted step time is the compute-only step plus the overhead.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from cs336_systems.core.costs import MiB
from cs336_systems.parallel.ddp import optimal_bucket, overhead_model
from cs336_systems.reporting import sanity
from cs336_systems.reporting.analysis import (
    empty_figure,
    failed_points,
    fit_latency_bandwidth,
    fmt,
    load,
    mark_suspect,
    md_table,
    ok,
    pct,
    plot_main,
    ran,
    save,
    stacked_bars,
)
from cs336_systems.stages.ddp.answers import _one, bucket_vs_overlap, peer_sentence
from cs336_systems.stages.ddp.peer import BUCKET_MB as PEER_BUCKET_MB

PARTS = [("fwd_bwd", "forward+backward"), ("comm", "gradient sync"), ("opt", "optimizer step")]


def run_label(variant: str, bucket: float | None) -> str:
    if variant == "bucketed":
        return f"bucketed {bucket:g} MiB"
    return {
        "baseline": "compute only (1 process)",
        "overlap": "overlap (per parameter)",
        "torch_ddp": f"PyTorch DDP (peer, {PEER_BUCKET_MB:g} MiB buckets)",
    }.get(variant, variant)


def _variants(df: pd.DataFrame) -> pd.DataFrame:
    if len(df) == 0 or "kind" not in df:
        return pd.DataFrame()
    return df[df["kind"] == "variants"].copy()


def _suspect(d: pd.DataFrame, variant: str) -> bool:
    """The variant ran, but only as a suspect row (no sentence may rest on it)."""
    r = ran(d)
    return _one(d, variant) is None and bool(sanity.is_suspect(r[r["variant"] == variant]).any())


def _inner(n: int) -> str:
    """'1 suspect point excluded: see Suspect numbers' (sanity.excluded without its brackets),
    for a note inside a sentence's own parentheses; '' for none."""
    return sanity.excluded(n).strip()[1:-1]


def _missing(d: pd.DataFrame, variants: tuple[str, ...], failed: str) -> str:
    """What a question says when a run it needs has no sentence: suspect, or did not succeed."""
    return sanity.missing_answer([v for v in variants if _suspect(d, v)], failed, " and the ")


def _optimizers(df: pd.DataFrame) -> str:
    """'AdamW (`adamw_fused`)', the implementation the runs record (`model.optimizer_impl`);
    where they differ, the variant table names each run's; 'AdamW' where none is recorded."""
    names = _optimizer_names(df)
    if not names:
        return "AdamW"
    if len(names) == 1:
        return f"AdamW (`{names[0]}`)"
    return "AdamW (" + ", ".join(f"`{n}`" for n in names) + ": each run's in the table)"


def _optimizer_names(df: pd.DataFrame) -> list[str]:
    r = ran(df)
    return sorted(set(r["optimizer"].dropna())) if "optimizer" in r else []


def comm_fits(df: pd.DataFrame, allreduce: pd.DataFrame) -> dict[str, dict]:
    """Latency o (s) and bandwidth w (B/s) from the all-reduce stage (same backend, world size,
    default buffers; its suspect points left out, `suspect` counts them) and from this stage's
    naive and flat runs (per-call cost from their difference: naive makes one call per gradient
    tensor, flat one)."""
    fits: dict[str, dict] = {}
    d = _variants(df)
    if len(d) == 0:
        return fits
    backend, n = d["backend"].iloc[0], int(d["world_size"].iloc[0])
    if len(allreduce):
        f = fit_latency_bandwidth(allreduce)
        if len(f):
            f = f[(f["backend"] == backend) & (f["world_size"] == n) & (f["buffers"] == "default")]
        if len(f):
            r = f.iloc[0]
            fits["allreduce stage"] = {
                "o": r.latency_us * 1e-6,
                "w": r.bandwidth_gbps * 1e9,
                "suspect": int(r.suspect),
            }
    naive, flat = _one(d, "naive"), _one(d, "flat")
    if naive is not None and flat is not None and naive.num_grad_tensors > 1:
        s = naive.grad_mb * MiB
        o = (naive.comm_ms_mean - flat.comm_ms_mean) * 1e-3 / (naive.num_grad_tensors - 1)
        if o > 0 and flat.comm_ms_mean * 1e-3 > o:
            fits["naive vs flat DDP runs"] = {"o": o, "w": s / (flat.comm_ms_mean * 1e-3 - o)}
    return fits


def bucket_table(df: pd.DataFrame, fit: dict | None) -> pd.DataFrame:
    """Every bucketed run that ran (column `suspect`: failed a sanity check), with the model's
    step beside it (the compute-only step of a baseline that passed the checks)."""
    d = ran(_variants(df))
    base = _one(d, "baseline")
    b = d[d["variant"] == "bucketed"].sort_values("bucket_size_mb")
    rows = []
    for r, flag in zip(b.itertuples(), sanity.is_suspect(b), strict=True):
        row = {
            "suspect": bool(flag),
            "bucket (MiB)": r.bucket_size_mb,
            "buckets": int(r.num_buckets),
            "step (ms)": r.step_ms_mean,
            "std (ms)": r.step_ms_std,
            "sync after backward (ms)": r.comm_ms_mean,
        }
        if fit is not None and base is not None:
            over = overhead_model(r.grad_mb * MiB, fit["w"], fit["o"], r.num_buckets)
            row["model overhead (ms)"] = over * 1e3
            row["model step (ms)"] = base.step_ms_mean + over * 1e3
        rows.append(row)
    return pd.DataFrame(rows)


def _shown_buckets(bt: pd.DataFrame) -> str:
    """The bucket table as printed: a suspect run's step time marked."""
    t = bt.drop(columns="suspect")
    t["step (ms)"] = [
        mark_suspect(fmt(v), f) for v, f in zip(bt["step (ms)"], bt["suspect"], strict=True)
    ]
    return md_table(t)


def _variant_table(d: pd.DataFrame, base_ms: float) -> pd.DataFrame:
    """Every variant run that ran, a suspect one's step time marked."""
    rows = []
    shown = ran(d)
    for r, flag in zip(shown.itertuples(), sanity.is_suspect(shown), strict=True):
        bucket = r.bucket_size_mb if r.variant == "bucketed" else None
        row = {
            "run": run_label(r.variant, bucket),
            "step (ms)": mark_suspect(f"{fmt(r.step_ms_mean)} ± {fmt(r.step_ms_std)}", flag),
            "fwd+bwd (ms)": r.fwd_bwd_ms_mean,
            "sync (ms)": r.comm_ms_mean,
            "optimizer (ms)": r.opt_ms_mean,
            "sync share": pct(r.comm_share) if r.variant != "baseline" else "–",
            "vs compute only": f"{fmt(r.step_ms_mean / base_ms)}×" if base_ms else "–",
        }
        if len(_optimizer_names(d)) > 1:
            row["optimizer"] = getattr(r, "optimizer", "–")
        if "prof_overlap_share" in d:
            share = getattr(r, "prof_overlap_share", math.nan)
            row["NCCL time overlapped"] = pct(share) if isinstance(share, float) else "–"
        rows.append(row)
    return pd.DataFrame(rows)


def _memory(df: pd.DataFrame) -> dict:
    if len(df) == 0 or "kind" not in df:
        return {}
    shown = ran(df[df["kind"] == "sharding"])
    m = ok(shown)
    if len(shown) == 0:
        return {}
    cols = {
        "params_mb": "parameters",
        "grads_mb": "gradients",
        "optimizer_state_mb": "optimizer state (this rank)",
        "mem_init_peak_mb": "peak after construction",
        "mem_before_step_peak_mb": "peak before optimizer step",
        "mem_after_step_peak_mb": "peak after optimizer step",
        "step_ms_mean": "step (ms)",
        "opt_ms_mean": "optimizer step (ms)",
    }
    t = shown.set_index("variant")[list(cols)].rename(columns=cols).T
    flags = dict(zip(shown["variant"], sanity.is_suspect(shown), strict=True))
    t = t.rename(columns={v: mark_suspect(v, bool(f)) for v, f in flags.items()})
    t = t.reset_index().rename(columns={"index": "MiB per rank (max over ranks)"})
    t.columns.name = None
    out = {
        "memory_table": md_table(t),
        "measured_peaks": bool(shown["mem_after_step_peak_mb"].notna().any()),
    }
    n_out = sanity.n_suspect(shown)
    if {"unsharded", "sharded"} <= set(shown["variant"]) and n_out:
        out["state"] = f"The two runs are not compared here{sanity.excluded(n_out)}."
    if {"unsharded", "sharded"} <= set(m["variant"]):
        u = m[m["variant"] == "unsharded"].iloc[0]
        s = m[m["variant"] == "sharded"].iloc[0]
        n = int(s.world_size)
        out["state"] = (
            f"The optimizer state held per rank falls from {fmt(u.optimizer_state_mb)} MiB to "
            f"{fmt(s.optimizer_state_mb)} MiB ({fmt(s.optimizer_state_mb / u.optimizer_state_mb)}×; "
            f"an even split over {n} ranks would be {fmt(1 / n)}× — parameters are assigned whole, "
            f"so the largest tensors limit the balance)."
        )
        if out["measured_peaks"]:
            saved = u.mem_after_step_peak_mb - s.mem_after_step_peak_mb
            out["peaks"] = (
                f"Peak memory after the optimizer step: {fmt(u.mem_after_step_peak_mb)} MiB "
                f"unsharded vs {fmt(s.mem_after_step_peak_mb)} MiB sharded ({fmt(saved)} MiB saved, "
                f"{pct(saved / u.mem_after_step_peak_mb)}); before the step "
                f"{fmt(u.mem_before_step_peak_mb)} vs {fmt(s.mem_before_step_peak_mb)} MiB; after "
                f"construction {fmt(u.mem_init_peak_mb)} vs {fmt(s.mem_init_peak_mb)} MiB (AdamW "
                f"allocates its state at the first step, so construction costs the same)."
            )
        out["time"] = (
            f"Time per step: {fmt(u.step_ms_mean)} ms unsharded vs {fmt(s.step_ms_mean)} ms "
            f"sharded; the optimizer step itself {fmt(u.opt_ms_mean)} vs {fmt(s.opt_ms_mean)} ms "
            f"(the sharded step updates 1/{n} of the parameters, then broadcasts every parameter "
            f"from its owner)."
        )
    return out


def context(results_dir: Path) -> dict:
    df = load(results_dir, "ddp")
    if len(df) == 0:
        return {"available": False}
    allreduce = load(results_dir, "allreduce")
    d = _variants(df)
    first = df.iloc[0]
    ctx: dict = {
        "available": True,
        "setup": (
            f"model `{first['size']}` ({fmt(first['params'] / 1e6, 1)} M parameters), context "
            f"{int(first['context_length'])}, batch {int(first['batch_per_rank'])} per rank, "
            f"{first['backend']} with {int(first['world_size'])} processes"
            f"{' (one per GPU)' if first['backend'] == 'nccl' else ' on the CPU'}, "
            f"fp32, {_optimizers(df)}; {int(first['warmup_steps'])} warm-up and "
            f"{int(first['measure_steps'])} measured steps per run"
        ),
        "n_points": len(df),
        "n_ok": len(ran(df)),
        "failed_table": md_table(
            failed_points(df, ["kind", "variant", "bucket_size_mb"]).drop_duplicates()
        )
        if len(ran(df)) < len(df)
        else "",
        "missing": {
            "q23": _missing(d, ("naive",), "The naive run did not succeed."),
            "q24": _missing(d, ("naive", "flat"), "The naive or the flat run did not succeed."),
            "q25": _missing(d, ("overlap",), "The overlapped run did not succeed."),
        },
    }
    base = _one(d, "baseline")
    base_ms = float(base.step_ms_mean) if base is not None else math.nan
    ctx["variant_table"] = md_table(_variant_table(d, base_ms)) if len(ran(d)) else ""
    ctx["baseline"] = (
        f"The compute-only step (forward, backward, AdamW on one process with the per-rank "
        f"batch, no communication) takes {fmt(base_ms)} ms."
        if base is not None
        else "The compute-only baseline failed a sanity check (see Suspect numbers): no ratio "
        "to it is given."
        if _suspect(d, "baseline")
        else "The compute-only baseline did not run."
    )
    naive, flat, overlap = _one(d, "naive"), _one(d, "flat"), _one(d, "overlap")
    if naive is not None:
        ctx["q23"] = (
            f"Naive DDP (one blocking all-reduce per parameter tensor, "
            f"{int(naive.num_grad_tensors)} calls for {fmt(naive.grad_mb)} MiB of gradients): "
            f"{fmt(naive.step_ms_mean)} ms per step, of which {fmt(naive.comm_ms_mean)} ms "
            f"({pct(naive.comm_share)}) is spent communicating gradients"
            + (
                f"; {fmt(naive.step_ms_mean / base_ms)}× the compute-only step."
                if base is not None
                else "."
            )
        )
    if naive is not None and flat is not None:
        ratio = naive.comm_ms_mean / flat.comm_ms_mean
        calls = int(naive.num_grad_tensors)
        if ratio > 1:
            verdict = (
                f"{fmt(ratio)}× less communication time): one call pays the per-call cost once "
                f"instead of {calls} times, at the price of copying the gradients into and out "
                "of one buffer."
            )
        else:
            verdict = (
                f"{fmt(1 / ratio)}× more communication time): here the {calls} per-call costs "
                "saved weigh less than copying the gradients into and out of one buffer and "
                "reducing it in one piece."
            )
        ctx["q24"] = (
            f"One all-reduce of the flattened gradients: {fmt(flat.step_ms_mean)} ms per step and "
            f"{fmt(flat.comm_ms_mean)} ms communicating, against {fmt(naive.step_ms_mean)} ms and "
            f"{fmt(naive.comm_ms_mean)} ms naive ({verdict}"
        )
    if overlap is not None:
        ref = ", ".join(
            f"{name} {fmt(r.step_ms_mean)} ms"
            for name, r in (("naive", naive), ("flat", flat))
            if r is not None
        )
        note = _inner(sum(_suspect(d, v) for v in ("naive", "flat")))
        ref = "; ".join(x for x in (ref, note) if x)
        text = (
            f"Overlapping each gradient's all-reduce with the rest of backward: "
            f"{fmt(overlap.step_ms_mean)} ms per step{f' ({ref})' if ref else ''}; only "
            f"{fmt(overlap.comm_ms_mean)} ms of communication is left after backward."
        )
        if base is not None:
            text += (
                f" Forward+backward itself takes {fmt(overlap.fwd_bwd_ms_mean)} ms against "
                f"{fmt(base.fwd_bwd_ms_mean)} ms without communication: the all-reduces "
                f"launched during backward compete with it for "
                f"{'SMs and memory bandwidth' if overlap.backend == 'nccl' else 'CPU cores'}."
            )
        share = overlap.get("prof_overlap_share", math.nan)
        if isinstance(share, float) and not math.isnan(share):
            text += (
                f" In the profiled step {pct(share)} of the NCCL kernel time "
                f"({fmt(overlap.prof_comm_kernel_ms)} ms) ran while compute kernels ran."
            )
        ctx["q25"] = text
    traces = sorted(set(ok(d).get("trace", pd.Series(dtype=str)).dropna().astype(str)) - {""})
    ctx["traces"] = [f"{results_dir}/ddp/raw/{t}" for t in traces]

    # Q26: bucket sizes against the overhead model
    fits = comm_fits(df, allreduce)
    ctx["fits"] = [
        f"{name}: o = {fmt(f['o'] * 1e6, 1)} us per call, w = {fmt(f['w'] / 1e9)} GB/s"
        + sanity.excluded(f.get("suspect", 0))
        for name, f in fits.items()
    ]
    n_pair = sum(_suspect(d, v) for v in ("naive", "flat"))
    if n_pair and all(_one(d, v) is not None or _suspect(d, v) for v in ("naive", "flat")):
        ctx["fits"].append(f"naive vs flat DDP runs: not fitted{sanity.excluded(n_pair)}")
    fit_name = next(iter(fits), None)
    fit = fits.get(fit_name) if fit_name else None
    bt = bucket_table(df, fit)
    ctx["bucket_table"] = _shown_buckets(bt) if len(bt) else ""
    ctx["fit_used"] = fit_name or ""
    bucketed = ok(d)[ok(d)["variant"] == "bucketed"]
    n_out = sanity.n_suspect(ran(d)[ran(d)["variant"] == "bucketed"]) if len(d) else 0
    if len(bucketed):
        best = bucketed.loc[bucketed["step_ms_mean"].idxmin()]
        ctx["best_bucket"] = (
            f"The fastest measured bucket size{sanity.excluded(n_out)} is "
            f"{fmt(best.bucket_size_mb)} MiB "
            f"({fmt(best.step_ms_mean)} ms per step"
            + (
                f", {fmt(best.step_ms_mean / base_ms)}× the compute-only step)."
                if base is not None
                else ")."
            )
        )
        if fit is not None:
            s = float(best.grad_mb) * MiB
            opt = optimal_bucket(s, fit["w"], fit["o"])
            ctx["model_best"] = (
                f"With s = {fmt(best.grad_mb)} MiB of gradients and the {fit_name} fit, the model "
                f"puts the optimum at n_b* = sqrt(s/(w·o)) = {fmt(opt['n_b'], 1)} buckets, a "
                f"bucket size of b* = sqrt(s·w·o) = {fmt(opt['bucket_mb'])} MiB, with "
                f"{fmt(opt['overhead_ms'])} ms of overhead"
                + (
                    "; since n_b* < 1, one bucket holding every gradient is the best the model "
                    "allows: the per-call cost outweighs what overlap can hide."
                    if opt["n_b"] < 1
                    else "."
                )
            )
            good = bt[~bt["suspect"]]
            if "model step (ms)" in good and len(good):
                err = (good["model step (ms)"] - good["step (ms)"]) / good["step (ms)"]
                slowed = (
                    "concurrent communication kernels"
                    if best.backend == "nccl"
                    else "the communication running on the same CPU cores"
                )
                ctx["model_error"] = (
                    f"Across the measured bucket sizes{sanity.excluded(n_out)} the model's step "
                    f"time is off by {pct(float(err.abs().mean()))} on average (largest "
                    f"{pct(float(err.abs().max()))}); it ignores the compute slowed down by "
                    f"{slowed}, the copies into and out of the bucket buffers, and that real "
                    f"buckets are not equal and backward does not produce gradients at a "
                    f"constant rate."
                )
    # every bucketed run may be suspect (a noisy shared CPU): the section then has no comparison
    ctx["bucket_vs_overlap"] = bucket_vs_overlap(d) if len(d) else []
    ctx["peer"] = peer_sentence(d) if len(d) else ""
    ctx["bucket_vs_overlap_excluded"] = sanity.excluded(n_out + _suspect(d, "overlap"))
    ctx.update(_memory(df))
    return ctx


def plot(results_dir: Path, fig_dir: Path) -> list[Path]:
    df = load(results_dir, "ddp")
    allreduce = load(results_dir, "allreduce")
    fig_dir = Path(fig_dir)
    paths = {n: fig_dir / f"ddp_{n}.png" for n in ("variants", "buckets", "memory")}
    out = []
    d = ok(_variants(df)) if len(df) else pd.DataFrame()

    # step time split into forward+backward, sync after backward and optimizer step
    if len(d) == 0:
        out.append(empty_figure(paths["variants"], "no successful DDP runs"))
    else:
        labels = [
            run_label(r.variant, r.bucket_size_mb if r.variant == "bucketed" else None)
            for r in d.itertuples()
        ]
        fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(d)), 4))
        stacked_bars(ax, labels, d, [(f"{col}_ms_mean", name) for col, name in PARTS])
        ax.errorbar(
            labels, d["step_ms_mean"], yerr=d["step_ms_std"], fmt="k.", label="step (total)"
        )
        ax.set_ylabel("ms per training step (slowest rank)")
        ax.set_title("DDP variants: where a step's time goes")
        ax.tick_params(axis="x", rotation=30)
        ax.legend(fontsize=8)
        out.append(save(fig, paths["variants"]))

    # bucket size: measured step time vs the overhead model
    b = d[d["variant"] == "bucketed"].sort_values("bucket_size_mb") if len(d) else d
    if len(b) == 0:
        tried = set(ran(_variants(df))["variant"]) if len(df) else set()
        why = "every one failed a sanity check" if "bucketed" in tried else "none succeeded"
        out.append(empty_figure(paths["buckets"], f"bucketed runs: {why}"))
    else:
        fig, ax = plt.subplots(figsize=(6.5, 4))
        ax.errorbar(
            b["bucket_size_mb"],
            b["step_ms_mean"],
            yerr=b["step_ms_std"],
            marker="o",
            label="measured",
        )
        base = _one(d, "baseline")
        fits = comm_fits(df, allreduce)
        if base is not None:
            ax.axhline(base.step_ms_mean, color="gray", ls=":", label="compute only")
            s = float(b["grad_mb"].iloc[0]) * MiB
            sizes = np.geomspace(b["bucket_size_mb"].min() / 4, b["bucket_size_mb"].max(), 100)
            for (name, f), style in zip(fits.items(), ("--", "-."), strict=False):
                n_b = np.maximum(1.0, s / (sizes * MiB))
                pred = base.step_ms_mean + 1e3 * (s / (n_b * f["w"]) + n_b * f["o"])
                ax.plot(sizes, pred, style, label=f"model ({name})")
        others = d[d["variant"].isin(["naive", "flat", "overlap"])]
        for r, color in zip(others.itertuples(), ("C3", "C4", "C5"), strict=False):
            ax.axhline(
                r.step_ms_mean,
                color=color,
                lw=0.9,
                ls=(0, (5, 3)),
                label=run_label(r.variant, None),
            )
        ax.set_xscale("log")
        ax.set_xlabel("bucket size (MiB)")
        ax.set_ylabel("ms per training step")
        ax.set_title("Bucketed DDP: step time vs bucket size")
        ax.legend(fontsize=7)
        out.append(save(fig, paths["buckets"]))

    # memory with and without optimizer-state sharding
    m = ok(df[df["kind"] == "sharding"]) if len(df) and "kind" in df else pd.DataFrame()
    if len(m) == 0:
        out.append(empty_figure(paths["memory"], "no successful sharding runs"))
    else:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        names = list(m["variant"])
        held = (
            ("params_mb", "parameters"),
            ("grads_mb", "gradients"),
            ("optimizer_state_mb", "optimizer state"),
        )
        stacked_bars(axes[0], names, m, held, fill=0)
        axes[0].set_ylabel("MiB per rank")
        axes[0].set_title("tensors held per rank")
        axes[0].legend(fontsize=8)
        peaks = [
            ("mem_init_peak_mb", "after construction"),
            ("mem_before_step_peak_mb", "before optimizer step"),
            ("mem_after_step_peak_mb", "after optimizer step"),
        ]
        if m["mem_after_step_peak_mb"].notna().any():
            x = np.arange(len(peaks))
            for i, r in enumerate(m.itertuples()):
                axes[1].bar(x + 0.4 * i, [getattr(r, c) for c, _ in peaks], 0.4, label=r.variant)
            axes[1].set_xticks(x + 0.2, [label for _, label in peaks])
            axes[1].set_ylabel("peak allocated MiB (max over ranks)")
            axes[1].legend(fontsize=8)
        else:
            axes[1].axis("off")
            axes[1].text(0.5, 0.5, "peak memory is measured on CUDA only", ha="center")
        axes[1].set_title("peak memory")
        out.append(save(fig, paths["memory"]))
    return out


if __name__ == "__main__":
    plot_main(plot)
