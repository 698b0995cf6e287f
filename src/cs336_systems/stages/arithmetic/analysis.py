"""Report context for the `arithmetic` stage: each answer of the handout's communication
arithmetic as a formula and as numbers, every number and sentence read from arithmetic.csv.
rows.py holds the tables, answers.py the sentences; each question's part of the context is
composed here."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cs336_systems.reporting.analysis import load, md_table, ok, plot_main
from cs336_systems.stages.arithmetic import answers
from cs336_systems.stages.arithmetic.rows import (
    FSDP_TP_FORMULAS,
    STRATEGIES,
    accounting_formulas,
    accounting_table,
    alternate_ring_table,
    case_label,
    formula,
    fsdp_tp_bounds,
    fsdp_tp_times,
    problem,
    quantity,
    ring_rows,
    ring_table,
    skipped_table,
    strategy_formulas,
    strategy_numbers,
)


def plot(results_dir: Path, fig_dir: Path) -> list[Path]:
    return []


def q34(d: pd.DataFrame) -> dict:
    rows = problem(d, "alternate_ring_all_reduce")
    if not len(rows):
        return {}
    return {
        "formula": formula(rows, "time"),
        "ring_formula": formula(rows, "ring_time"),
        "slowdown_formula": formula(rows, "slowdown"),
        "table": alternate_ring_table(rows),
        "equal_at_two": bool((rows[rows["quantity"] == "slowdown"]["value"] == 1.0).any()),
    }


def q35(d: pd.DataFrame) -> dict:
    if not d["problem"].isin(list(STRATEGIES)).any():
        return {}
    sentences = answers.strategy_sentences(d)
    rows = d[d["problem"].isin(list(STRATEGIES))]
    formulas, numbers = strategy_formulas(rows), strategy_numbers(rows)
    return {"formulas": formulas, "table": numbers, "sentences": sentences}


def q36(d: pd.DataFrame) -> dict:
    rows = problem(d, "fsdp_tp_calcs")
    if not len(rows):
        return {}
    return {
        "formulas": {q: formula(rows, q) for q in FSDP_TP_FORMULAS},
        "bounds": fsdp_tp_bounds(rows),
        "times": fsdp_tp_times(rows),
        "sentences": answers.fsdp_tp_sentences(rows),
    }


def q38(d: pd.DataFrame) -> dict:
    """communication_accounting (2025): each part's answer from the rows of the handout's mesh,
    part (d) from the variants'."""
    rows = problem(d, "communication_accounting")
    if not len(rows):
        return {}
    base = rows[rows["variant"] == "handout"]
    v = {q: quantity(base, q) for q in base["quantity"]}
    return {
        "setting": answers.accounting_setting(base.iloc[0]),
        "a": answers.accounting_a(base, v),
        "b": answers.accounting_b(base, v),
        "c": answers.accounting_c(base, v),
        "d": answers.accounting_d(rows, base, v),
        "table": accounting_table(rows),
        "formulas": accounting_formulas(base),
    }


def justified_table(parts: list[dict]) -> str:
    """Each calc: its part, its answer and why."""
    return md_table(pd.DataFrame(parts), numparse=False) if parts else ""


def q16(d: pd.DataFrame) -> dict:
    """memory_profiling (d) for the model the handout names: the derivation and its sizes."""
    rows = problem(d, "residual_activation")
    if not len(rows):
        return {}
    return answers.activation(rows)


def ring(d: pd.DataFrame) -> dict:
    if not len(problem(d, "ring_check")):
        return {}
    rows = ring_rows(d)
    return {
        "sources": list(dict.fromkeys(rows["source"].astype(str))),
        "table": ring_table(rows),
        "sentences": answers.ring_sentences(rows),
    }


def context(results_dir: Path) -> dict:
    df = load(results_dir, "arithmetic")
    if len(df) == 0:
        return {"available": False}
    if "edition" in df and set(df["edition"].astype(str)) == {"2025"}:
        # a 2025 run answers its own problem only: section 8's problems are the 2026 handout's
        df = df[df["problem"].isin(["communication_accounting", "residual_activation"])]
    good = ok(df)
    skipped = df[df["status"] != "ok"]
    skipped_text = skipped_table(df)
    cases = [c for c in df["case"].drop_duplicates() if c != "b200"]
    measured_ok = [c for c in cases if (good["case"] == c).any()]
    sources = {
        case_label(c): str(good[good["case"] == c]["source"].iloc[0])
        for c in good["case"].drop_duplicates()
    }
    ctx = {
        "available": True,
        # each calc's answer and its one-sentence justification, part by part
        "justified": justified_table(answers.justified(good)),
        "q34": q34(good),
        "q35": q35(good),
        "q36": q36(good),
        "q38": q38(good),
        "q16": q16(good),
        "ring": ring(good),
        "sources": sources,
        "skipped": skipped_text,
        "measured_missing": [c for c in cases if c not in measured_ok],
    }
    if ctx["measured_missing"]:
        ctx["coverage"] = answers.coverage(skipped)
    return ctx


if __name__ == "__main__":
    plot_main(plot)
