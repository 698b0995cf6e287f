"""Report context and figures for the `benchmark` stage (questions 1-4): `context` composes one
function per question (the run, the phases of a training step, Q1 backward over forward, Q2
warm-up, Q3 speedups, Q4 MFU) from the rows (rows.py), tables (tables.py) and sentences
(answers.py); `plot` draws the figures (figures.py)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cs336_systems.planning.edition import size_table
from cs336_systems.reporting import sanity
from cs336_systems.reporting.analysis import (
    SIZE_ORDER,
    failed_points,
    load,
    md_table,
    ok,
    own_model_note,
    plot_main,
    ran,
    sort_sizes,
)
from cs336_systems.stages.benchmark import answers, tables
from cs336_systems.stages.benchmark.figures import plot
from cs336_systems.stages.benchmark.rows import (
    backward_ratios,
    device_of,
    eager_naive,
    host_bound,
    host_bound_points,
    load_all_engines,
    load_benchmark,
    phase_host_bound,
    speedups,
    warmup_summary,
    without_points,
)

# how other readers (the comparison report) read this stage's CSVs
LOADERS = {"benchmark": load_benchmark}

PHASE_CONTEXT = 512  # the 2026 handout: "use context length 512 unless otherwise specified"


def run_facts(df: pd.DataFrame, engines: pd.DataFrame) -> dict:
    """What ran (points, statuses, the engines' table) and how (sizes, contexts, batch, steps)."""
    s: dict = {"n_points": len(df)}
    e = tables.engines_table(engines)
    s["engines_table"] = md_table(e) if len(e) else ""
    s["engines_ran"] = sorted(set(engines.get("engine", pd.Series(dtype=str)).dropna()))
    s["n_ok"] = len(ran(df))
    s["n_suspect"] = sanity.n_suspect(ran(df))
    s["statuses"] = df["status"].value_counts().to_dict()
    keys = ["size", "context_length", "mode", "precision", "compile", "attention"]
    s["failed_table"] = (
        md_table(sort_sizes(failed_points(df, keys))) if len(ran(df)) < len(df) else ""
    )
    s["sizes"] = [x for x in SIZE_ORDER if x in set(df["size"])]
    s["contexts"] = sorted(set(df["context_length"]))
    s["batch_size"] = int(df["batch_size"].iloc[0])
    s["warmup_steps"] = int(df["warmup_steps"].iloc[0])
    s["measure_steps"] = int(df["measure_steps"].iloc[0])
    s["protocol"] = answers.protocol_sentence(s["warmup_steps"], s["measure_steps"], df)
    return s


def phase_summary(df: pd.DataFrame, d: pd.DataFrame, hb: pd.DataFrame | None = None) -> dict:
    """2026's benchmarking question: forward, backward and optimizer step of a training step
    (eager, naive attention), for every size of the rows' edition at context 512 (the context
    nearest 512 where none ran at 512); a size without a measured step says why. A host-bound
    size (`hb`, rows.host_bound) is kept in the table but out of the backward/forward ratio:
    its passes' times are the host's."""
    t_all = eager_naive(df[df["mode"] == "train_step"])
    if "fwd_ms_median" not in df or not len(t_all):
        return {}
    contexts = sorted(set(t_all["context_length"]))
    ctx = min(contexts, key=lambda c: (abs(c - PHASE_CONTEXT), c))
    editions = sorted({int(e) for e in df.get("edition", pd.Series(dtype=float)).dropna()})
    names = list(size_table(editions[0])) if len(editions) == 1 else sorted(set(df["size"]))
    t = eager_naive(d[(d["mode"] == "train_step") & (d["context_length"] == ctx)])
    out = {"context": ctx, "edition": editions[0] if len(editions) == 1 else None, "tables": {}}
    # core/harness.py StepClock: CUDA events on a GPU, the host clock on a CPU
    cuda = "device" in t_all and (t_all["device"].astype(str) == "cuda").any()
    out["clock"] = "CUDA events on the device" if cuda else "the host clock"
    out["sentences"] = []
    for prec in [p for p in ("fp32", "bf16") if p in set(t_all["precision"])]:
        host = answers.host_sizes(hb, prec, ctx)
        out["tables"][prec] = tables.phase_table(t, t_all, prec, ctx, names, set(df["size"]), host)
        g = t[t["precision"] == prec].set_index("size")
        if len(g):
            out["sentences"].append(answers.phase_sentence(d, g, prec, ctx, hb))
    return out


def backward_over_forward(df: pd.DataFrame, d: pd.DataFrame, hb: pd.DataFrame) -> dict:
    """Q1: backward vs forward (a point whose forward or forward+backward is suspect drops out,
    and so does a host-bound one: its ratio is the host's)."""
    r = without_points(backward_ratios(eager_naive(d)), hb)
    dropped = backward_ratios(eager_naive(ran(df)))
    s: dict = {"bwd": answers.backward_sentences(r, dropped)}
    s["bwd_short"] = answers.q1_backward_shorter(r)
    if extremes := answers.backward_extremes(r):
        s["bwd_extremes"] = extremes
    return s


def q1_point(df: pd.DataFrame, w: pd.DataFrame, size: str) -> pd.Series | None:
    """Q1's row at the sweep's point of `size` (context, mode, precision, batch; eager, naive
    attention), where it ran and passed the checks."""
    sweep = w[w["size"] == size].iloc[0]
    d = eager_naive(ok(df)) if len(df) else df
    if not len(d):
        return None
    keys = ("size", "context_length", "mode", "precision", "batch_size")
    hit = d[[all(r[k] == sweep[k] for k in keys) for _, r in d.iterrows()]]
    return hit.iloc[0] if len(hit) else None


def warmup(w: pd.DataFrame, df: pd.DataFrame | None = None) -> list[dict]:
    """Q2: per size of the warm-up sweep (each count in a process of its own), its table, the
    first steps and why they cost more, 1-2 warm-ups against the longest, and the sweep against
    Q1's same point (`df`: the benchmark's rows)."""
    ws = warmup_summary(w) if len(w) else pd.DataFrame()
    out = []
    for size, g in ws.groupby("size") if len(ws) else []:
        g = g.set_index("warmup_steps").sort_index()
        entry = {"size": size, "table": tables.warmup_table(g), **answers.first_steps(size, g)}
        entry["why"] = answers.why_first_step(w)
        entry["few"] = answers.warmup_after(g, device_of(w))
        q1 = q1_point(df, w, size) if df is not None else None
        entry["q1"] = answers.warmup_vs_q1(g, q1)
        pids = w.loc[w["size"] == size].get("process_id", pd.Series(dtype=float)).dropna()
        entry["processes"] = (
            f"each warm-up count ran in a process of its own ({pids.nunique()} processes)"
            if len(pids) and pids.nunique() == len(pids)
            else "the warm-up counts ran one after another in one process (rows written before "
            "the sweep started a process per count): a later count found the libraries warm"
        )
        out.append(entry)
    return out


def speedup_summary(sp: pd.DataFrame, what: str, n_excluded: int = 0) -> dict:
    """One speedup's table, sentence and the points where it does not pay."""
    if len(sp) == 0:
        return {"sentence": answers.no_pairs(what, n_excluded), "losers": "", "table": ""}
    table = tables.speedup_table(sp)
    return {
        "table": table,
        "sentence": answers.speedup_sentence(sp, what, n_excluded),
        "losers": answers.losers(sp),
    }


def bf16_and_compile(df: pd.DataFrame, d: pd.DataFrame) -> dict:
    """Q3: bf16 and compile speedups, each point against itself (same size, context, mode and
    attention); the headline over naive attention, the model the handout benchmarks."""
    a = ran(df)
    naive, naive_all = d[d["attention"] == "naive"], a[a["attention"] == "naive"]
    bf = speedups(naive[naive["compile"] == "eager"], "precision", "fp32", "bf16")
    bf_all = speedups(naive_all[naive_all["compile"] == "eager"], "precision", "fp32", "bf16")
    s = {}
    s["bf16"] = speedup_summary(
        bf, "bf16 autocast over fp32 (eager, naive attention, each point against itself)",
        len(bf_all) - len(bf),
    )  # fmt: skip
    s["bf16"]["trend"] = answers.speedup_trend(bf)
    s["bf16"]["host"] = answers.without_host_bound(
        bf, host_bound(naive) if "peak_tflops" in d else None
    )
    other = d[(d["compile"] == "eager") & (d["attention"] != "naive")]
    s["bf16"]["others"] = answers.other_attentions(
        speedups(other, "precision", "fp32", "bf16"),
        host_bound(other) if "peak_tflops" in d else None,
    )
    cp = speedups(naive, "compile", "eager", "compiled")
    cp_all = speedups(naive_all, "compile", "eager", "compiled")
    s["compile"] = speedup_summary(
        cp, "torch.compile over eager (naive attention, each point against itself)",
        len(cp_all) - len(cp),
    )  # fmt: skip
    # torch_compile (b): the table of every compiled mode beside eager, suspect ones marked
    whole = tables.compile_table(df)
    if whole:
        s["compile"]["table"] = whole
    return s


def mfu(results_dir: Path, df: pd.DataFrame, d: pd.DataFrame) -> dict:
    """Q4: MFU, from points that passed the checks, against the ceiling of the model's path."""
    r = ran(df)
    s: dict = {"mfu_missing": answers.mfu_missing(r), "mfu_paths": answers.mfu_paths(r)}
    s["datasheet"] = answers.datasheet_peaks(r)
    n_mfu_suspect = int((sanity.is_suspect(r) & r["tflops"].notna()).sum())
    if "mfu" in d and d["mfu"].notna().any():
        s["mfu_best"] = answers.mfu_best(d) + sanity.excluded(n_mfu_suspect)
        t = d[(d["mode"] == "train_step") & d["mfu"].notna()]
        s["mfu_over"] = ""
        if len(t):
            s["mfu_table"] = tables.mfu_table(t)
            s["mfu_over"] = ", ".join(sorted(set(t["attention"].astype(str))))
        else:  # every training step failed a sanity check (or none ran): say so, draw nothing
            s["mfu_table"] = (
                "_No training step has an MFU to show" + sanity.excluded(n_mfu_suspect) + "._"
            )
        s["mfu_goal"] = answers.goal_breakdown(d, load(results_dir, "ceilings"))
    return s


OWN_MODEL_SAYS = (
    "one more size of the grid, timed as the course's are; its FLOPs (`flops_per_step`, "
    "`tflops`, MFU) are counted from its module or declared (the `flops_source` column), the "
    "engines (`fast`, `hf_gpt2`) run the course's model only (skipped rows)."
)


def context(results_dir: Path) -> dict:
    df = load_benchmark(results_dir)
    w = load(results_dir, "benchmark_warmup")
    s: dict = {"available": len(df) > 0}
    if not s["available"]:
        return s
    d = ok(df)
    s.update(run_facts(df, load_all_engines(results_dir)))
    s["latency_fp32"] = tables.latency_table(df, "fp32")
    s["latency_bf16"] = tables.latency_table(df, "bf16")
    # one rule (rows.host_bound) on every mode and on every phase of the training step
    pairs = host_bound(d) if "peak_tflops" in d else pd.DataFrame()
    phases = phase_host_bound(d) if "peak_tflops" in d else pd.DataFrame()
    s["host_bound"] = answers.host_bound_note(pd.concat([pairs, phases], ignore_index=True))
    every = pd.concat([pairs, phases], ignore_index=True)
    hb = host_bound_points(ran(df), every)  # every pass, phase and precision of those points
    s["phases"] = phase_summary(df, d, hb)
    s["pass_times"] = answers.pass_times(d, ran(df))
    s["variability"] = answers.variability(d, s["measure_steps"], device_of(df))
    s.update(backward_over_forward(df, d, hb))
    s["warmup"] = warmup(w, df)
    s.update(bf16_and_compile(df, d))
    s.update(mfu(results_dir, df, d))
    s["own_model_note"] = own_model_note(df, OWN_MODEL_SAYS)
    return s


__all__ = ["LOADERS", "context", "phase_summary", "plot"]


if __name__ == "__main__":
    plot_main(plot)
