"""The `leaderboard` stage's rows as the report reads them: the CSV with MFU against the peak of
each row's matmul path, a row's label, one profiled step's parts per rank, and the section's
tables (the runs, the breakdown, the ablation). Used by analysis.py, answers.py (the
sentences) and figures.py."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd

from cs336_systems.reporting.analysis import fmt, load, mark_suspect, pct, ran
from cs336_systems.reporting.sanity import is_suspect
from cs336_systems.stages.leaderboard.mfu import with_path_mfu
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

# the column in which a row records the setting its ablation changes, and that column in words
ABLATION_SETTING = {
    "attention_ours": "attention",
    "attention_cudnn": "attention",
    "sdpa": "attention",
    "plain_loss": "loss",
    "fsdp_per_layer": "fsdp_units",
    "no_prefetch": "prefetch",
    "whole_blocks": "checkpointing",
    "every_1": "checkpointing",
    "every_2": "checkpointing",
    "no_compile": "compiled",
}
SETTING_WORDS = {"fsdp_units": "FSDP unit", "compiled": "compilation"}


def load_rows(results_dir: Path) -> pd.DataFrame:
    """leaderboard.csv with MFU against the peak of each row's matmul path (rows written before
    the path was recorded get it inferred: mfu.py with_path_mfu)."""
    ceilings = Path(results_dir) / "ceilings.csv"
    return load(results_dir, "leaderboard", derive=lambda df: with_path_mfu(df, ceilings))


def run_label(r) -> str:
    """The row as the tables name it: configuration, variant or ablation, world size, layers. An
    ablation's name is the setting its row ran (`plain_loss`: the plain loss), so the row is the
    engine with it."""
    what = r["ablation"] if isinstance(r.get("ablation"), str) and r["ablation"] else r["variant"]
    if r["config"] == "ablation":
        what = f"engine with {what}"
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
                "run": run_label(r),
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


def _step_range(r) -> tuple[float, float] | None:
    """(fastest, slowest) measured step of a row in seconds, None where not recorded."""
    lo, hi = r.get("step_ms_min", math.nan), r.get("step_ms_max", math.nan)
    lo, hi = float(lo) if lo is not None else math.nan, float(hi) if hi is not None else math.nan
    return (lo / 1e3, hi / 1e3) if lo == lo and hi == hi else None


def _range_text(rng) -> str:
    return f"{fmt(rng[0], 3)}–{fmt(rng[1], 3)}" if rng else ""


def _setting_text(value) -> str:
    return {"True": "on", "False": "off"}.get(str(value), str(value))


def _unchanged(name: str, r, base) -> str:
    """Where the ablation row `r` ran the setting its ablation changes as the engine row `base`
    did (the switch changed nothing): "the engine's <setting> was already <value>"; "" where
    it differs or a row does not record it."""
    col = ABLATION_SETTING.get(name)
    mine, ref = (r.get(col), base.get(col)) if col else (None, None)
    if mine is None or ref is None or pd.isna(mine) or pd.isna(ref) or str(mine) != str(ref):
        return ""
    return f"the engine's {SETTING_WORDS.get(col, col)} was already {_setting_text(ref)}"


def _cost(r, base) -> str:
    """The row's median step less the engine's, read as a cost only where it exceeds the two
    rows' spreads together (each its slowest step less its fastest): within them, which steps
    each row happened to draw could make it."""
    diff = (float(r["step_ms_median"]) - float(base["step_ms_median"])) / 1e3
    rng, ref_rng = _step_range(r), _step_range(base)
    if not (rng and ref_rng):
        return f"{fmt(diff, 2)} s"
    spread = (rng[1] - rng[0]) + (ref_rng[1] - ref_rng[0])
    beyond = f"beyond the {fmt(spread, 2)} s the two rows' steps spread over"
    if diff < -spread:  # the row without the optimization is the faster one
        return f"none: the step is {fmt(-diff, 2)} s faster without it ({beyond})"
    if diff > spread:
        return f"{fmt(diff, 2)} s ({beyond})"
    ranges = f"its {_range_text(rng)} s, the engine's {_range_text(ref_rng)}"
    if rng[0] > ref_rng[1] or rng[1] < ref_rng[0]:  # every step on one side
        side = "slower" if rng[0] > ref_rng[1] else "faster"
        return (
            f"{fmt(diff, 2)} s, every step {side} than the engine's, though within the "
            f"{fmt(spread, 2)} s the two rows' steps spread over ({ranges})"
        )
    return (
        f"within the steps' spread ({fmt(diff, 2)} s, inside the {fmt(spread, 2)} s the two "
        f"rows' steps spread over: {ranges})"
    )


def _attribution(name: str, r, base) -> tuple[str, str]:
    """(what the ablation row `r` says its optimization buys against the engine row `base`, a
    warning for its table cell or ""): nothing where it changed nothing, not attributed where it
    also ran another checkpointing (unless the checkpointing is what it changes), else _cost."""
    words = ABLATION_WORDS.get(name, name)
    if same := _unchanged(name, r, base):
        return f"{words}: no change, {same}", f" ⚠ no change: {same}"
    ref_plan = str(base["checkpointing"]) if "checkpointing" in base else ""
    plan = str(r.get("checkpointing", ""))
    if pins_checkpointing(name, ref_plan) and plan != ref_plan:  # two changes in one row
        why = f"its row also ran another checkpointing, {plan} against the engine's {ref_plan}"
        return f"{words}: not attributed ({why})", f" ⚠ checkpointing {plan}, not {ref_plan}"
    return f"{words}: {_cost(r, base)}", ""


def _table_row(r, ref: float, first_free: float) -> dict:
    """An ablation row's cells beside the engine's median step `ref` (ms); a failed row whose
    GPUs had less free than at the job's first row (`first_free`, GB) is flagged suspect."""
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
    return {
        "turned off": ABLATION_WORDS.get(r["ablation"], r["ablation"]),
        "status": status,
        "attention": r.get("attention", "") if ok else "",
        "checkpointing": r.get("checkpointing", "") if ok else "",
        "step (s)": fmt(step / 1e3, 3),
        "steps min–max (s)": _range_text(_step_range(r)) if ok else "",
        "vs the engine": f"{fmt(step / ref, 2)}×" if ok and ref == ref else "",
        "peak GiB/rank": fmt(r.get("peak_mem_gib_per_rank"), 1) if ok else "",
    }


def ablation_table(df: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Each ablation row beside the full engine row: its step and what the optimization it
    turns off buys (_attribution), or why it did not run."""
    base = ran(df)
    base = base[(base["config"] == "full") & (base["variant"] == "engine")]
    abl = df[df["config"] == "ablation"]
    if not len(abl):
        return pd.DataFrame(), []
    ref = float(base["step_ms_median"].iloc[0]) if len(base) else math.nan
    first_free = float(abl["free_gb"].iloc[0]) if "free_gb" in abl else math.nan
    rows, buys = [], []
    for _, r in abl.iterrows():
        rows.append(_table_row(r, ref, first_free))
        if r["status"] == "ok" and ref == ref:
            said, warning = _attribution(r["ablation"], r, base.iloc[0])
            buys.append(said)
            rows[-1]["vs the engine"] += warning
    return pd.DataFrame(rows), buys
