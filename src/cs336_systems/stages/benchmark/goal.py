"""The benchmark's speed-goal sentence: the goal point's step, its MFU, and its split into
forward, backward and optimizer against fused AdamW's byte floor (analysis.py renders it)."""

from __future__ import annotations

import pandas as pd

from cs336_systems.core.analysis import pct, sig

# fused AdamW per fp32 parameter: reads param, grad, exp_avg, exp_avg_sq; writes all but grad
ADAMW_BYTES_PER_PARAM = 4 * 4 + 3 * 4


def goal_breakdown(d: pd.DataFrame, ceilings: pd.DataFrame) -> list[str]:
    """The speed goal's point (xl, context 512, bf16, compiled, train step), per attention, with
    the step split into forward, backward and optimizer by the step's own phase marks (where
    they are missing, by the differences of the three modes' means, said as such: runs made
    before the forward_backward mode set the gradients to None added into them, which put that
    difference below the optimizer's floor). An optimizer time below fused AdamW's byte floor
    at the measured copy bandwidth cannot be right: it is shown as suspect."""
    sel = d[
        (d["size"] == "xl")
        & (d["context_length"] == 512)
        & (d["precision"] == "bf16")
        & (d["compile"] == "compiled")
    ]
    if "engine" in sel:
        sel = sel[sel["engine"].fillna("plain") == "plain"]
    copy = (
        ceilings[(ceilings.get("kind") == "copy") & (ceilings.get("status") == "ok")]
        if len(ceilings)
        else ceilings
    )
    copy_gbps = float(copy["gbps"].iloc[0]) if len(copy) else float("nan")
    out = []
    for attention, g in sel.groupby("attention"):
        t = g.set_index("mode")["step_ms_mean"]
        if "train_step" not in t:
            continue
        row = g[g["mode"] == "train_step"].iloc[0]
        text = (
            f"attention `{attention}`: {row.step_ms_mean:.1f} ms per step, {sig(row.tflops)} "
            + (
                f"TFLOP/s, **{pct(row.mfu)} MFU** against the measured bf16 peak of the model's "
                f"path ({sig(row.peak_tflops)} TFLOP/s)"
                if row.mfu == row.mfu
                else "TFLOP/s (no MFU: this run has no bf16 ceiling through the model's path)"
            )
        )
        phases = [row.get(f"{p}_ms_mean", float("nan")) for p in ("fwd", "bwd", "opt")]
        if all(x == x for x in phases):
            fwd, bwd, opt = phases
            how = "timed between marks within the step"
        elif {"forward", "forward_backward"} <= set(t.index):
            fwd, fb = t["forward"], t["forward_backward"]
            bwd, opt = fb - fwd, row.step_ms_mean - fb
            how = "differences of the forward, forward+backward and step modes' means"
        else:
            out.append(text)
            continue
        floor = ADAMW_BYTES_PER_PARAM * row.params / (copy_gbps * 1e9) * 1e3
        text += (
            f". Of the step ({how}), forward takes {fwd:.1f} ms, backward {bwd:.1f} ms and the "
            f"optimizer {opt:.1f} ms ({100 * opt / row.step_ms_mean:.0f}% of the step, which "
            "adds no counted FLOPs)"
        )
        fb_rows = g[g["mode"] == "forward_backward"]
        if len(fb_rows) and fb_rows.iloc[0].mfu == fb_rows.iloc[0].mfu:
            text += (
                f"; forward+backward alone (its own mode) runs at {pct(fb_rows.iloc[0].mfu)} MFU"
            )
        if floor == floor:
            text += (
                f". Fused AdamW must move {ADAMW_BYTES_PER_PARAM} bytes per fp32 parameter, a "
                f"floor of {floor:.1f} ms at the measured copy bandwidth ({copy_gbps:.0f} GB/s)"
            )
            if opt < floor:
                text += (
                    f": **suspect**, the optimizer's {opt:.1f} ms is below it, so this split "
                    "cannot be right"
                )
            else:
                text += f", {floor / opt:.0%} of the optimizer's time"
        out.append(text)
    return out
