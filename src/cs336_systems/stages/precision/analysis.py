"""Report context and figures for the `precision` stage (questions 10-12, and bf16 vs fp32
speed and memory from the benchmark and memory stages). rows.py holds the tables, answers.py the
sentences, figures.py the figures; each question's part of the context is composed here."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cs336_systems.reporting.analysis import load, ok, plot_main
from cs336_systems.stages.precision import answers
from cs336_systems.stages.precision.figures import draw
from cs336_systems.stages.precision.rows import (
    accumulation_table,
    devices_agree,
    dtypes_table,
    layernorm_rows,
    layernorm_table,
    memory_ratio,
    speedups,
)


def plot(results_dir: Path, fig_dir: Path) -> list[Path]:
    return draw(results_dir, fig_dir)


def _accumulation(acc: pd.DataFrame) -> dict:
    """Q10: 0.01 added 1000 times in each precision."""
    dev = "cuda" if (acc["device"] == "cuda").any() else "cpu"
    s: dict = {"table": accumulation_table(acc)}
    s["sentences"] = answers.accumulation_sentences(acc[acc["device"] == dev].set_index("variant"))
    if len(acc["device"].unique()) > 1:
        s["devices_agree"] = devices_agree(acc)
    return s


def _dtypes(dts: pd.DataFrame) -> dict:
    """Q11: the dtype of each tensor of the toy model under autocast."""
    s: dict = {}
    good = ok(dts)
    skipped = dts[dts["status"] != "ok"] if "status" in dts else pd.DataFrame()
    if len(good):
        s["table"] = dtypes_table(good)
        s["sentences"] = answers.dtype_sentences(good)
        ln = good[good["tensor"] == "LayerNorm output"].set_index(["device", "autocast"])["dtype"]
        if ("cuda", "fp16") in ln.index:
            s["ln_cuda"] = ln[("cuda", "fp16")]
        if ("cpu", "fp16") in ln.index:
            s["ln_cpu"] = ln[("cpu", "fp16")]
    if len(skipped):
        s["skipped"] = answers.skipped_lines(skipped)
    return s


def _layernorm(ln: pd.DataFrame) -> dict:
    """Q12: LayerNorm's errors in low precision, and why."""
    good = ok(ln)
    if good.empty:
        return {}
    d, dev = layernorm_rows(good)
    return {
        "table": layernorm_table(d),
        "device": dev,
        "sentences": answers.layernorm_sentences(d),
    }


def _speed_and_memory(results_dir: Path) -> dict:
    """bf16 autocast against fp32: speed from the benchmark stage, memory from the memory
    stage."""
    s: dict = {}
    bench = load(results_dir, "benchmark")
    if len(bench):
        sp = speedups(bench)
        if len(sp):
            s["speed_sentence"] = answers.speed_sentence(sp)
    mem = load(results_dir, "memory")
    if len(mem):
        ratio, cuda = memory_ratio(mem)
        if ratio is not None:
            s["memory_sentence"] = answers.memory_sentence(ratio, cuda)
    return s


def context(results_dir: Path) -> dict:
    acc = load(results_dir, "precision")
    s: dict = {"available": len(acc) > 0}
    if not s["available"]:
        return s
    good = ok(acc)
    s["skipped"] = [f"{r.device}: {r.status}" for r in acc[acc["status"] != "ok"].itertuples()]
    s["accumulation"] = _accumulation(good) if len(good) else {}
    s["dtypes"] = _dtypes(load(results_dir, "precision_dtypes"))
    s["layernorm"] = _layernorm(load(results_dir, "precision_layernorm"))
    s["speed_memory"] = _speed_and_memory(results_dir)
    return s


if __name__ == "__main__":
    plot_main(plot)
