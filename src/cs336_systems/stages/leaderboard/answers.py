"""The `leaderboard` section's answers in words: Q37 (the full configuration's engine step,
its MFU and the 10-minute rule), what the engine measured to choose its attention and
checkpointing, the optimizer's kernels against their byte floor, and why a breakdown recorded
before the profiler's own ranges were left out is withheld."""

from __future__ import annotations

import math

import pandas as pd

from cs336_systems.reporting.analysis import fmt, pct, ran
from cs336_systems.reporting.sanity import is_suspect
from cs336_systems.stages.leaderboard.rows import GIB, rank_parts, run_label


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
        sheet = r.get("mfu_datasheet")
        mfu += (
            f" and {pct(sheet)} against the datasheet's {fmt(r['datasheet_tflops_per_gpu'], 0)}"
            " TFLOP/s per GPU (dense bf16)"
            if sheet is not None and pd.notna(sheet)
            else " (no datasheet MFU: the device is not in core/costs.py DATASHEET_TFLOPS)"
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


def breakdown_withheld(r: pd.Series) -> str:
    """Why the profiled step of `r` (breakdown_unsound) is not shown."""
    parts = rank_parts(r).get(0, {})
    return (
        f"The profiled step of {run_label(r)} was split by code that counted the "
        f"profiler's own range around the step, which CUDA also records as a device "
        f"event spanning every kernel, as one more kernel: it took half of each "
        f"instant, so every part below it read half its time and `other` the rest "
        f"(its 'other' read {pct(parts.get('other', math.nan) / parts.get('window', math.nan))} "
        f"of the step). Its parts are not shown; the step time is unaffected. The "
        f"leaderboard stage's code now leaves such ranges out (its rows carry "
        f"`breakdown_version` 2)."
    )
