"""Report context and figures for the `fsdp` stage (questions 32 and 33: fsdp_accounting).

(a) FSDP's expected saving against optimizer-state sharding comes from
`core/costs.py:training_state_bytes` (parameters, gradients and AdamW state one rank holds under
each scheme, all-gather buffers ignored) beside the measured bytes each rank holds and the
measured peaks; (b) whether the weight all-gathers finish in time comes from the profiled step:
the all-gather time on the timeline and the share of it that ran while compute ran
(`profiling/overlap.py`), with fp32 and bf16 compute, units of a block and of a layer, and the
part of the step the GPU ran anything at all (a step whose GPU idles is host-bound, whatever its
communication does) and the time compute waited for a gather; answers.py writes those sentences,
rows.py holds what both read. Memory in MiB (2^20 bytes).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from cs336_systems.core.costs import MiB, fsdp_saving_vs_optimizer_sharding
from cs336_systems.reporting import sanity
from cs336_systems.reporting.analysis import (
    failed_points,
    fmt,
    load,
    mark_suspect,
    md_table,
    ok,
    pct,
    plot_main,
    ran,
)
from cs336_systems.stages.fsdp.answers import q33
from cs336_systems.stages.fsdp.figures import draw
from cs336_systems.stages.fsdp.rows import (
    LABELS,
    _busy,
    _label,
    _left_out,
    _missing,
    _num,
    _row,
    analytic,
)

WAITED = "compute waited for all-gathers (ms)"  # (GPU runs that measured it)


def time_table(df: pd.DataFrame) -> pd.DataFrame:
    """Every run that ran, a suspect one's step time marked."""
    rows = []
    d = ran(df)
    for r, flag in zip(d.itertuples(), sanity.is_suspect(d), strict=True):
        g = r._asdict()
        rows.append(
            {
                "run": LABELS.get(r.variant, r.variant),
                "step (ms)": mark_suspect(f"{fmt(r.step_ms_mean)} ± {fmt(r.step_ms_std)}", flag),
                "forward (ms)": r.fwd_ms_mean,
                "backward (ms)": r.bwd_ms_mean,
                "sync after backward (ms)": r.comm_ms_mean,
                "optimizer (ms)": r.opt_ms_mean,
                "collective calls / step": _calls(g),
                "all-gather MiB / step": g.get("all_gather_into_tensor_mb", math.nan),
                "reduce-scatter MiB / step": g.get("reduce_scatter_tensor_mb", math.nan),
                "all-reduce MiB / step": g.get("all_reduce_mb", math.nan),
                "all-gather on timeline (ms)": g.get("prof_all_gather_ms", math.nan),
                "all-gather hidden": pct(g.get("prof_all_gather_overlap_share", math.nan)),
                WAITED: fmt(g.get("prof_all_gather_waited_ms", math.nan)),
                "GPU busy in the profiled step": _busy_text(g),
            }
        )
    return pd.DataFrame(rows)


def _calls(g: dict) -> str:
    kinds = (
        ("all_gather_into_tensor", "AG"),
        ("reduce_scatter_tensor", "RS"),
        ("all_reduce", "AR"),
    )
    if g.get("collectives_counted") in (False, "False"):
        return "not counted"  # the peer's collectives bypass the counting ones
    parts = [(g.get(f"{k}_calls", math.nan), name) for k, name in kinds]
    return ", ".join(f"{int(n)} {name}" for n, name in parts if n == n and n > 0) or "0"


def _busy_text(g) -> str:
    b = _busy(g)
    return "n/a" if b != b else f"{pct(b)} of {fmt(g['prof_step_ms'], 0)} ms"


MEMORY_ROWS = [
    ("params_mb", "parameters held"),
    ("grads_mb", "gradients held"),
    ("optimizer_state_mb", "optimizer state held"),
    ("held_mb", "parameters + gradients + optimizer state"),
    ("gathered_peak_mb", "most gathered full weights at once"),
    ("mem_init_allocated_mb", "allocated after construction"),
    ("mem_init_peak_mb", "peak during construction"),
    ("mem_forward_peak_mb", "peak during forward"),
    ("mem_backward_peak_mb", "peak during backward (and sync)"),
    ("mem_before_step_allocated_mb", "allocated before optimizer step"),
    ("mem_after_step_allocated_mb", "allocated after optimizer step"),
    ("mem_step_peak_mb", "peak during optimizer step"),
    ("mem_reserved_mb", "reserved by the allocator after the step (CUDA graphs' pools too)"),
]


def memory_table(df: pd.DataFrame, measured: bool) -> pd.DataFrame:
    """Every run that ran, one column each (a suspect run's name marked)."""
    d = ran(df)
    rows = MEMORY_ROWS if measured else MEMORY_ROWS[:5]
    out = {"MiB per rank (max over ranks)": [label for _, label in rows]}
    for r, flag in zip(d.itertuples(), sanity.is_suspect(d), strict=True):
        out[_label(r.variant, flag)] = [getattr(r, col, math.nan) for col, _ in rows]
    return pd.DataFrame(out)


def _setup(first: pd.Series) -> str:
    return (
        f"model `{first['size']}` ({fmt(first['params'] / 1e6, 1)} M parameters: d_model "
        f"{int(first['d_model'])}, d_ff {int(first['d_ff'])}, {int(first['num_layers'])} layers), "
        f"context {int(first['context_length'])}, batch {int(first['batch_per_rank'])} per rank, "
        f"{first['backend']} with {int(first['world_size'])} processes"
        f"{' (one per GPU)' if first['backend'] == 'nccl' else ' on the CPU'}, AdamW, fp32 "
        f"master weights; {int(first['warmup_steps'])} warm-up and "
        f"{int(first['measure_steps'])} measured steps per run"
    )


def _peak_gap(so: pd.Series, fs: pd.Series, s: int, w: int, saving: float, got: float) -> str:
    """Why the peak-to-peak saving falls short of the counted one, from the run's own numbers:
    a backward peak barely above the forward peak is backward's start, where the activations
    are all alive and few gradients exist, so only the parameter half of the saving (less the
    full weights FSDP has gathered) can show there; the gradient half shows once backward has
    produced them all (allocated before the optimizer step)."""
    params = 4 * s * (1 - 1 / w) / MiB
    gathered = float(fs.gathered_peak_mb)
    rises = [_num(r, "mem_backward_peak_mb") - _num(r, "mem_forward_peak_mb") for r in (so, fs)]
    before = [_num(r, "mem_before_step_allocated_mb") for r in (so, fs)]
    expect = params - gathered
    residual = got - expect
    if not max(rises) < 0.25 * params:  # a peak later in backward: gradients count there
        return (
            f" The backward peaks are {fmt(rises[0])} and {fmt(rises[1])} MiB above the "
            f"forward peaks: what FSDP holds there beyond its counted tensors is not measured."
        )
    text = (
        f" Both runs peak early in backward: the backward peak is {fmt(rises[0])} MiB above "
        f"the forward peak with the sharded optimizer and {fmt(rises[1])} MiB with FSDP, while "
        f"the activations are nearly all alive and few gradients exist yet. There only the "
        f"parameter half of the saving, 4 bytes × {s:,} × (1 − 1/{w}) = {fmt(params)} MiB, can "
        f"show, less the full weights FSDP has gathered (up to {fmt(gathered)} MiB): "
        f"{fmt(expect)} MiB, "
    )
    if abs(residual) <= 0.05 * saving:
        text += f"{fmt(abs(residual))} MiB from the measured {fmt(got)} MiB."
    else:
        text += f"which leaves {fmt(residual)} MiB of the measured {fmt(got)} MiB unexplained."
    if not any(math.isnan(b) for b in before):
        done = before[0] - before[1]
        text += (
            f" The gradient half shows once backward has produced every gradient: allocated "
            f"before the optimizer step, {fmt(before[0])} MiB against {fmt(before[1])} MiB, "
            f"{fmt(done)} MiB saved ({pct(done / saving)} of the expected saving)."
        )
    return text


def q32(df: pd.DataFrame, measured: bool) -> str:
    so, fs = _row(df, "sharded_optimizer"), _row(df, "fsdp")
    d = ok(df)
    if fs is None or not len(d):
        return ""
    s, rep, w = int(fs.sharded_params), int(fs.replicated_params), int(fs.world_size)
    saving = fsdp_saving_vs_optimizer_sharding(s, rep, w) / MiB
    text = (
        f"Optimizer-state sharding splits only the AdamW moments (8 bytes per parameter) over "
        f"the ranks; FSDP also splits the fp32 parameters and gradients of its units ({s:,} "
        f"parameters: every block's weights and norm gains, the embedding and the LM head; the "
        f"other {rep:,} stay replicated, with their whole AdamW state). The expected saving per "
        f"rank, all-gather buffers ignored (`core/costs.py:fsdp_saving_vs_optimizer_sharding`), "
        f"is (4 + 4) bytes × {s:,} × (1 − 1/{w}) for the sharded parameters and gradients, less "
        f"8 bytes × {rep:,} × (1 − 1/{w}) of replicated optimizer state: **{fmt(saving)} MiB**."
    )
    if so is not None:
        held = float(so.held_mb) - float(fs.held_mb)
        text += (
            f" The tensors each rank holds (parameters, gradients, optimizer state: counted, "
            f"max over ranks) come to {fmt(float(so.held_mb))} MiB with the sharded optimizer "
            f"and {fmt(float(fs.held_mb))} MiB with FSDP, a saving of **{fmt(held)} MiB** (the "
            f"count the formula makes, so it matches by construction"
        )
        state_gap = float(so.optimizer_state_mb) - float(fs.optimizer_state_mb)
        if abs(state_gap) > 0.01 * saving:
            text += (
                f"; the sharded optimizer assigns whole parameters to ranks, so its largest "
                f"rank holds {fmt(state_gap)} MiB more optimizer state than an even split"
            )
        text += ")."
        peak_so, peak_fs = _num(so, "mem_backward_peak_mb"), _num(fs, "mem_backward_peak_mb")
        if measured and not math.isnan(peak_fs) and not math.isnan(peak_so):
            got = peak_so - peak_fs
            short = saving - got
            text += (
                f" Peak to peak, the allocator's peak during backward is {fmt(peak_so)} MiB with "
                f"the sharded optimizer and {fmt(peak_fs)} MiB with FSDP: a saving of "
                f"**{fmt(got)} MiB**, {pct(got / saving)} of the expected one."
            )
            if short > 0.05 * saving:
                text += _peak_gap(so, fs, s, w, saving, got)
    return text + _left_out(df, ("sharded_optimizer",))


def context(results_dir: Path) -> dict:
    df = load(results_dir, "fsdp")
    if len(df) == 0:
        return {"available": False}
    first = df.iloc[0]
    d = ok(df)
    skipped = df[df["status"].astype(str).str.startswith("skipped")]
    kinds = sorted(set(df.get("optimizer", pd.Series(dtype=str)).dropna().astype(str)))
    words = {"adamw_fused": "fused kernels", "adamw_foreach": "foreach kernels"}
    ctx: dict = {
        "available": True,
        "setup": _setup(first),
        "optimizer": " and ".join(words.get(k, k) for k in kinds) or "its kind not recorded",
        "n_points": len(df),
        "n_ok": len(ran(df)),
        "failed_table": md_table(failed_points(df, ["variant"]).drop_duplicates())
        if len(ran(df)) < len(df)
        else "",
        "skipped": "",
        "missing": {
            "q32": _missing(df, ("fsdp",), "The FSDP run did not succeed."),
            "q33": _missing(df, ("fsdp", "fsdp_bf16"), "No FSDP run succeeded."),
        },
    }
    if len(skipped):
        cmds = sorted(set(skipped["command"].dropna().astype(str)))
        ctx["skipped"] = (
            f"This machine could not run the stage ({skipped['status'].iloc[0]}). On a machine "
            f"that can, this command measures it (what the workflow runs with "
            f"`--config preset={first.get('preset', 'gpu')} stages='[fsdp]'`):"
        )
        ctx["commands"] = cmds
    shown = ran(df)
    if not len(shown):
        return ctx
    measured = (
        bool(shown["mem_step_peak_mb"].notna().any()) if "mem_step_peak_mb" in shown else False
    )
    ctx["measured_peaks"] = measured
    times = time_table(df)
    waited = ran(df).get("prof_all_gather_waited_ms", pd.Series(dtype=float))
    ctx["waited"] = bool(pd.to_numeric(waited, errors="coerce").notna().any())
    ctx["time_table"] = md_table(times if ctx["waited"] else times.drop(columns=WAITED))
    ctx["memory_table"] = md_table(memory_table(df, measured))
    a = analytic(df, shown=True)
    ctx["analytic_table"] = md_table(a) if len(a) else ""
    for q, text in (("q32", q32(df, measured)), ("q33", q33(df) if len(d) else "")):
        if text:
            ctx[q] = text
    traces = sorted(set(d.get("trace", pd.Series(dtype=str)).dropna().astype(str)) - {""})
    ctx["traces"] = [f"{results_dir}/fsdp/raw/{t}" for t in traces]
    return ctx


def plot(results_dir: Path, fig_dir: Path) -> list[Path]:
    """The section's figures (stages/fsdp/figures.py)."""
    return draw(results_dir, fig_dir)


if __name__ == "__main__":
    plot_main(plot)
