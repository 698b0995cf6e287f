"""The leaderboard section: every number and sentence from leaderboard.csv, and the figure of
one profiled step's breakdown per (config, variant)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from cs336_systems.reporting.analysis import (
    empty_figure,
    failed_points,
    fmt,
    load,
    mark_suspect,
    md_table,
    pct,
    plot_main,
    ran,
    save,
)
from cs336_systems.reporting.sanity import is_suspect
from cs336_systems.stages.leaderboard.measure import with_path_mfu
from cs336_systems.stages.leaderboard.plan import pins_checkpointing

# the compute parts of a profiled step (engine/leaderboard_rules.py classify), then what adds the rest of
# its wall time: communication no compute hid, and the GPU idle (GPU); or the host's (CPU)
PARTS = ("attention", "matmul", "loss", "optimizer", "other")
REST = ("communication_exposed", "idle", "host", "communication")
GIB = 2**30
PART_WORDS = {
    "communication_exposed": "communication exposed",
    "communication": "copies for collectives",  # compute-stream kernels under a collective call
    "idle": "GPU idle",
    "host": "host (Python, waits)",
}


def _label(r) -> str:
    what = r["ablation"] if isinstance(r.get("ablation"), str) and r["ablation"] else r["variant"]
    if r["config"] == "ablation":
        what = f"engine without {what}"
    return f"{r['config']} / {what} (W={int(r['world_size'])}, L={int(r['num_layers'])})"


def results_table(d: pd.DataFrame) -> pd.DataFrame:
    """Every run that ran; a rate the sanity checks doubt (reporting/sanity.py) carries the flag."""
    rows = []
    doubted = is_suspect(d, "rate")
    for i, r in d.iterrows():
        peak = r.get("peak_mem_gib_per_rank")
        if (peak is None or pd.isna(peak)) and pd.notna(r.get("peak_mem_gb_per_rank")):
            peak = float(r["peak_mem_gb_per_rank"]) * 1e3 / 1024  # MiB / 1000, written earlier
        rows.append(
            {
                "run": _label(r),
                "attention": r.get("attention", ""),
                "checkpointing": r.get("checkpointing", ""),
                "step (s)": fmt(r["step_ms_median"] / 1e3, 3),
                "tokens/s": fmt(r["tokens_per_s"], 0),
                "TFLOP/s": fmt(r["tflops"], 1),
                "MFU": mark_suspect(pct(r["mfu"]), bool(doubted[i]))
                if pd.notna(r["mfu"])
                else "n/a (no bf16 ceiling)",
                "matmul path": r.get("matmul_path", ""),
                "peak GiB/rank": fmt(peak, 1),
                "setup (s)": fmt(r["setup_s"], 1),
                "benchmark (s)": fmt(r["benchmark_s"], 0),
                "10-min rule": "fits" if bool(r["fits_10_min"]) else "over",
            }
        )
    return pd.DataFrame(rows)


def rank_parts(r: pd.Series) -> dict[int, dict[str, float]]:
    """{rank: {part: ms}} of a row's profiled step, the window (`window`) included; rows written
    before the per-rank columns: rank 0 from `breakdown_<part>_ms`."""
    out: dict[int, dict[str, float]] = {}
    for col, value in r.items():
        m = re.fullmatch(r"breakdown_r(\d+)_(\w+)_ms", str(col))
        if m and pd.notna(value):
            out.setdefault(int(m.group(1)), {})[m.group(2)] = float(value)
    return out


def breakdown_table(r: pd.Series) -> tuple[pd.DataFrame, list[str]]:
    """One row per rank: each part in ms and its share of the step's window, the window, and
    the communication compute hid (beside the sum); with the ranks whose parts do not add up to
    their window (within 0.1%)."""
    rows, off = [], []
    for rank, parts in sorted(rank_parts(r).items()):
        window = parts.get("window", math.nan)
        cells = [p for p in (*PARTS, *REST) if p in parts]
        row = {"rank": rank}
        for p in cells:
            row[PART_WORDS.get(p, p)] = f"{fmt(parts[p], 0)} ({pct(parts[p] / window)})"
        row["step on the timeline (ms)"] = fmt(window, 0)
        if "communication_hidden" in parts:
            row["communication hidden (ms)"] = fmt(parts["communication_hidden"], 0)
        total = sum(parts[p] for p in cells)
        if not abs(total - window) <= 1e-3 * window:
            off.append(f"rank {rank}: {fmt(total, 1)} of {fmt(window, 1)} ms")
        rows.append(row)
    return pd.DataFrame(rows), off


def breakdown_unsound(r: pd.Series) -> bool:
    """A GPU row profiled before the timeline left out the device-side copies of
    record_function ranges (no `breakdown_version`, or below 2): its parts are halved."""
    if r.get("backend") != "nccl" or not rank_parts(r):
        return False
    v = r.get("breakdown_version")
    return v is None or pd.isna(v) or float(v) < 2


def optimizer_floor(r: pd.Series, ceilings: pd.DataFrame) -> str:
    """The optimizer's kernels against the bytes AdamW must move at the measured copy rate."""
    k = r.get("breakdown_optimizer_kernels_ms")
    nbytes = r.get("optimizer_bytes_per_rank")
    if k is None or nbytes is None or pd.isna(k) or pd.isna(nbytes) or not len(ceilings):
        return ""
    copy = ceilings[(ceilings.get("kind") == "copy") & (ceilings["status"] == "ok")]
    if not len(copy) or "gbps" not in copy:
        return ""
    rate = float(copy["gbps"].max())
    floor = nbytes / (rate * 1e9) * 1e3
    return (
        f"The optimizer's kernels take {fmt(k, 1)} ms of rank 0's step; fused AdamW reads the "
        f"fp32 parameter, gradient and two moments and writes three of them back, 28 bytes for "
        f"each of this rank's {fmt(nbytes / 28 / 1e9, 2)} billion parameters "
        f"({fmt(nbytes / 1e9, 1)} GB), {fmt(floor, 1)} ms at the {fmt(rate, 0)} GB/s the "
        f"ceilings stage copied: {fmt(k / floor, 2)}× its byte floor."
    )


def _step_range(r) -> tuple[float, float] | None:
    """(fastest, slowest) measured step of a row in seconds, None where not recorded."""
    lo, hi = r.get("step_ms_min", math.nan), r.get("step_ms_max", math.nan)
    lo, hi = float(lo) if lo is not None else math.nan, float(hi) if hi is not None else math.nan
    return (lo / 1e3, hi / 1e3) if lo == lo and hi == hi else None


def _range_text(rng) -> str:
    return f"{fmt(rng[0], 3)}–{fmt(rng[1], 3)}" if rng else ""


def ablation_table(df: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Each ablation row beside the full engine row: its step and what the optimization it
    turns off buys (the row's step less the engine's), or why it did not run. A difference is
    read as one only where the two rows' measured steps (fastest to slowest) do not overlap and
    the row ran the engine's checkpointing (unless the checkpointing is what it changes)."""
    base = ran(df)
    base = base[(base["config"] == "full") & (base["variant"] == "engine")]
    rows, buys = [], []
    abl = df[df["config"] == "ablation"]
    if not len(abl):
        return pd.DataFrame(), []
    ref = float(base["step_ms_median"].iloc[0]) if len(base) else math.nan
    ref_plan = str(base["checkpointing"].iloc[0]) if len(base) and "checkpointing" in base else ""
    ref_range = _step_range(base.iloc[0]) if len(base) else None
    first_free = float(abl["free_gb"].iloc[0]) if "free_gb" in abl else math.nan
    for _, r in abl.iterrows():
        name = r["ablation"]
        ok = r["status"] == "ok"
        step = float(r["step_ms_median"]) if ok else math.nan
        status = "ok" if ok else str(r["status"])
        free = float(r.get("free_gb", math.nan))
        if not ok and free == free and first_free == first_free and free < 0.9 * first_free:
            # the same GPUs had less free than at the job's first row: rows before it left
            # memory allocated, so this status says nothing of the configuration itself
            status = (
                f"{status} ⚠ suspect: {fmt(free, 1)} GB free at this row against "
                f"{fmt(first_free, 1)} at the job's first: memory earlier rows kept"
            )
        rows.append(
            {
                "turned off": ABLATION_WORDS.get(name, name),
                "status": status,
                "attention": r.get("attention", "") if ok else "",
                "checkpointing": r.get("checkpointing", "") if ok else "",
                "step (s)": fmt(step / 1e3, 3),
                "steps min–max (s)": _range_text(_step_range(r)) if ok else "",
                "vs the engine": f"{fmt(step / ref, 2)}×" if ok and ref == ref else "",
                "peak GiB/rank": fmt(r.get("peak_mem_gib_per_rank"), 1) if ok else "",
            }
        )
        if ok and ref == ref:
            plan = str(r.get("checkpointing", ""))
            own = not pins_checkpointing(name, ref_plan)  # its change is the checkpointing
            rng = _step_range(r)
            overlap = rng and ref_range and rng[0] <= ref_range[1] and ref_range[0] <= rng[1]
            if (own or not ref_plan or plan == ref_plan) and overlap:
                buys.append(
                    f"{ABLATION_WORDS.get(name, name)}: nothing measurable "
                    f"({fmt((step - ref) / 1e3, 2)} s, its steps' range "
                    f"{_range_text(rng)} s overlapping the engine's {_range_text(ref_range)})"
                )
            elif own or not ref_plan or plan == ref_plan:
                buys.append(f"{ABLATION_WORDS.get(name, name)}: {fmt((step - ref) / 1e3, 2)} s")
            else:  # two changes in one row: not what the optimization alone buys
                rows[-1]["vs the engine"] += f" ⚠ checkpointing {plan}, not {ref_plan}"
                buys.append(
                    f"{ABLATION_WORDS.get(name, name)}: not attributed (its row also ran "
                    f"another checkpointing, {plan} against the engine's {ref_plan})"
                )
    return pd.DataFrame(rows), buys


ABLATION_WORDS = {
    "attention_ours": "auto attention (our FlashAttention-2 forced)",
    "attention_cudnn": "auto attention (SDPA's cuDNN forced)",
    "sdpa": "auto attention (SDPA's own backend choice)",
    "plain_loss": "the fused loss (full logits, F.cross_entropy)",
    "fsdp_per_layer": "FSDP units of a block (one unit per Linear)",
    "no_prefetch": "FSDP's prefetch (each gather when its unit runs)",
    "whole_blocks": "selective checkpointing (whole blocks only)",
    "every_1": "measured checkpointing (every block checkpointed)",
    "every_2": "measured checkpointing (pairs of blocks checkpointed)",
    "no_compile": "compiled blocks (eager)",
}


def q37(df: pd.DataFrame) -> str:
    d = ran(df)
    full = d[(d["config"] == "full") & (d["variant"] == "engine")]
    if not len(full):
        why = df[(df["config"] == "full") & (df["variant"] == "engine")]["status"]
        reason = why.iloc[0] if len(why) else "not run"
        return f"The full configuration's engine step was not measured here ({reason})."
    r = full.iloc[0]
    mfu = ""
    if pd.notna(r["mfu"]):
        mfu = (
            f", {pct(r['mfu'])} MFU against {fmt(r['peak_tflops_per_gpu'], 0)} TFLOP/s per rank "
            f"(the measured bf16 peak of the path its matmuls take, `{r['matmul_path']}`)"
        )
    if bool(is_suspect(full, "rate").iloc[0]):
        mfu = f"; its MFU is left out: {r['sanity']}"
    rule = "within" if bool(r["fits_10_min"]) else "over"
    peak = r.get("peak_mem_gib_per_rank")
    mem = f", {fmt(peak, 1)} GiB at most on a rank" if peak is not None and pd.notna(peak) else ""
    return (
        f"The engine's step takes {fmt(r['step_ms_median'] / 1e3, 3)} s on "
        f"{int(r['world_size'])} ranks ({fmt(r['tflops'], 1)} TFLOP/s{mfu}{mem}); setup "
        f"(build, compile, warm-up) {fmt(r['setup_s'], 0)} s, so the whole benchmark from an "
        f"empty process would take {fmt(r['benchmark_s'], 0)} s, {rule} the 10 minutes."
    )


def choices(r: pd.Series) -> list[str]:
    """What the engine measured to choose its attention and checkpointing."""
    out = []
    ours, peer = r.get("attention_flash_triton_ms"), r.get("attention_sdpa_cudnn_ms")
    if ours is not None and pd.notna(ours):
        peer_txt = (
            f", SDPA's cuDNN {fmt(peer, 1)} ms" if peer is not None and pd.notna(peer) else ""
        )
        out.append(
            f"Attention: forward + backward of one layer at this shape, our FlashAttention-2 "
            f"{fmt(ours, 1)} ms{peer_txt}; the engine runs `{r['attention']}`."
        )
    if pd.notna(r.get("calibration_choice", math.nan)):
        out.append(
            "Checkpointing: a first step with the last block plain, the one before it with only "
            f"its FFN half checkpointed and the rest checkpointed alone measured what a block "
            f"keeps for backward: {fmt(r['calibration_block_plain_bytes'] / GIB, 2)} GiB plain, "
            f"{fmt(r['calibration_block_ffn_bytes'] / GIB, 2)} GiB with its FFN half "
            f"checkpointed, {fmt(r['calibration_block_input_bytes'] / GIB, 2)} GiB checkpointed "
            f"whole (its output); the least recomputation whose predicted peak, "
            f"{fmt(r['calibration_predicted_peak_bytes'] / GIB, 1)} GiB, fits the "
            f"{fmt(r['calibration_budget_bytes'] / GIB, 1)} GiB budget is "
            f"`{r['calibration_choice']}` (the memory model alone chose "
            f"`{r['calibration_model_choice']}`)."
        )
    return out


def _load(results_dir: Path) -> pd.DataFrame:
    """leaderboard.csv with MFU against the peak of each row's matmul path (rows written before
    the path was recorded get it inferred: measure.py with_path_mfu)."""
    ceilings = Path(results_dir) / "ceilings.csv"
    return load(results_dir, "leaderboard", derive=lambda df: with_path_mfu(df, ceilings))


def context(results_dir: Path) -> dict:
    df = _load(results_dir)
    if len(df) == 0:
        return {"available": False}
    d = ran(df)
    first = df.iloc[0]
    skipped = df[df["status"].astype(str).str.startswith("skipped")]
    ctx: dict = {
        "available": True,
        "setup": (
            f"d_model {int(first['d_model'])}, d_ff {int(first['d_ff'])}, "
            f"{int(first['num_layers'])} layers, {int(first['num_heads'])} heads, context "
            f"{int(first['context_length'])}, vocab {int(first['vocab'])}, batch "
            f"{int(first['batch'])}, bf16, backend {first['backend']}"
        ),
        "n_points": len(df),
        "n_ok": len(d),
        "skipped_table": md_table(failed_points(df, ["config", "variant"]).drop_duplicates())
        if len(d) < len(df)
        else "",
        "commands": sorted(set(skipped["command"].dropna().astype(str))),
        "q37": q37(df),
    }
    if len(d):
        ctx["results_table"] = md_table(results_table(d))
        ctx["device_time"] = bool((d["backend"] == "nccl").any())
        full = d[(d["config"].isin(["full", "reduced"])) & (d["variant"] == "engine")]
        if len(full):
            r = full.iloc[0]
            table, off = breakdown_table(r)
            if breakdown_unsound(r):
                table, off = pd.DataFrame(), []
                ctx["breakdown_unsound"] = (
                    f"The profiled step of {_label(r)} was split by code that counted the "
                    f"profiler's own range around the step, which CUDA also records as a device "
                    f"event spanning every kernel, as one more kernel: it took half of each "
                    f"instant, so every part below it read half its time and `other` the rest "
                    f"(its 'other' read {pct(rank_parts(r).get(0, {}).get('other', math.nan) / rank_parts(r).get(0, {}).get('window', math.nan))} "
                    f"of the step). Its parts are not shown; the step time is unaffected. The "
                    f"leaderboard stage's code now leaves such ranges out (its rows carry "
                    f"`breakdown_version` 2)."
                )
            ctx["breakdown_run"] = _label(r)
            ctx["breakdown_table"] = md_table(table) if len(table) else ""
            ctx["breakdown_off"] = off
            ctx["top_kernels"] = str(r.get("breakdown_top_kernels", "") or "")
            if ctx["top_kernels"] == "nan":
                ctx["top_kernels"] = ""
            ceilings = Path(results_dir) / "ceilings.csv"
            ceil = pd.read_csv(ceilings) if ceilings.exists() else pd.DataFrame()
            ctx["optimizer_floor"] = "" if breakdown_unsound(r) else optimizer_floor(r, ceil)
            ctx["choices"] = choices(r)
        abl, buys = ablation_table(df)
        ctx["ablation_table"] = md_table(abl) if len(abl) else ""
        ctx["ablation_buys"] = buys
    for key in ("breakdown_unsound", "breakdown_table", "top_kernels", "optimizer_floor"):
        ctx.setdefault(key, "")
    ctx.setdefault("choices", [])
    ctx.setdefault("breakdown_off", [])
    return ctx


def plot(results_dir: Path, fig_dir: Path) -> list[Path]:
    """Rank by rank, the engine's profiled step on its timeline: the compute parts, exposed
    communication and idle time (GPU) or the host's rest (CPU), adding up to the step."""
    df = _load(results_dir)
    path = Path(fig_dir) / "leaderboard_breakdown.png"
    d = ran(df) if len(df) else pd.DataFrame()
    full = d[d["config"].isin(["full", "reduced"]) & (d["variant"] == "engine")] if len(d) else d
    ranks = rank_parts(full.iloc[0]) if len(full) else {}
    if not ranks:
        why = "no profiled leaderboard step" + (
            f" ({df['status'].iloc[0]})" if len(df) and "status" in df else ""
        )
        return [empty_figure(path, why)]
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.6 * len(ranks)))
    labels = [f"rank {k}" for k in sorted(ranks)]
    bottom = np.zeros(len(ranks))
    for p in (*PARTS, *REST):
        vals = np.array([ranks[k].get(p, 0.0) for k in sorted(ranks)]) / 1e3
        if vals.any():
            ax.barh(labels, vals, left=bottom, label=PART_WORDS.get(p, p))
            bottom += vals
    ax.set_xlabel("seconds of one profiled step (device timeline: parts add up to the step)")
    # the legend in one row between the bar and the title, the title lifted above it
    ax.set_title(f"where a leaderboard step goes: {_label(full.iloc[0])}", pad=22)
    n = len(ax.get_legend_handles_labels()[1])
    ax.legend(fontsize=7, ncol=n, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    return [save(fig, path)]


if __name__ == "__main__":
    plot_main(plot)
