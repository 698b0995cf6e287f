"""The `arithmetic` stage's rows as the report reads them: a case's label, one quantity's value
or formula, numbers as the report writes them, and each question's tables (the alternate ring,
the strategies' formulas and numbers, the 2-D split's bounds and times, the communication
accounting's variants and formulas, the ring model against the measurements). Used by
analysis.py and answers.py."""

from __future__ import annotations

import pandas as pd

from cs336_systems.reporting.analysis import md_table, sig

STRATEGIES = {"data_parallel_calcs": "DP", "fsdp_calcs": "FSDP", "tp_calcs": "TP"}
GB = 1e9  # the handout's GB (its 80 GB H100 and 95 GB TPU v5p)
# the 2-D split's formulas the report shows
FSDP_TP_FORMULAS = (
    "forward_flops",
    "fsdp_comm_time",
    "tp_comm_time",
    "comm_time_overlapped",
    "comm_time_serial",
    "max_devices",
    "max_devices_large_n",
    "serial_best_n_fsdp",
    "serial_best_n_tp",
    "serial_max_devices",
    "serial_max_devices_large_n",
)


def case_label(case: str) -> str:
    if case == "b200":
        return "B200 (handout)"
    if case.startswith("tpu-"):
        return f"TPU {case.removeprefix('tpu-')} (handout)"
    if case == "model":
        return "the handout's model (memory_profiling (d))"
    backend = case.split("-", 1)[1]
    return f"this machine ({backend})"


def quantity(rows: pd.DataFrame, name: str, **where) -> float:
    """The value of quantity `name` in `rows` (those matching `where`); nan where absent."""
    r = rows[rows["quantity"] == name]
    for k, v in where.items():
        r = r[r[k] == v]
    return float(r["value"].iloc[0]) if len(r) else float("nan")


def formula(rows: pd.DataFrame, name: str) -> str:
    r = rows[rows["quantity"] == name]
    return str(r["formula"].iloc[0]) if len(r) else "–"


def ms(x: float) -> str:
    return f"{sig(x * 1e3)} ms"


def gb(x: float) -> str:
    return f"{sig(x / GB)} GB"


def problem(d: pd.DataFrame, name: str) -> pd.DataFrame:
    return d[d["problem"] == name]


# ---- Q34: the alternate ring -------------------------------------------------------------


def alternate_ring_table(rows: pd.DataFrame) -> str:
    """Per case and device count: the alternate all-reduce's time against the ring's."""
    out = []
    for case, g in rows.groupby("case", sort=False):
        g = g[g["shape"] == g["shape"].iloc[0]]
        for n, h in g.groupby("devices"):
            t, ring = quantity(h, "time"), quantity(h, "ring_time")
            out.append(
                {
                    "case": case_label(case),
                    "W GB/s": sig(h["W_gbps"].iloc[0]),
                    "N": int(n),
                    "S (MiB)": sig(h["message_mb"].iloc[0]),
                    "alternate (N-1) S/W": ms(t),
                    "ring 2 (N-1)/N S/W": ms(ring),
                    "alternate / ring": f"{sig(t / ring)}×",
                }
            )
    return md_table(pd.DataFrame(out))


# ---- Q35: DP, FSDP and TP ----------------------------------------------------------------


def _passes(p: pd.DataFrame):
    """(pass, its quantities' prefix, the quantity bounding N) of each pass `p` answers."""
    for pass_ in ("forward", "backward"):
        pre = f"{pass_}_"
        if not (p["quantity"] == pre + "comm_time").any():
            continue
        bound = (
            pre + "max_devices" if (p["quantity"] == pre + "max_devices").any() else "max_devices"
        )
        yield pass_, pre, bound


def strategy_formulas(rows: pd.DataFrame) -> str:
    """Per strategy and pass: FLOPs per device, communication time, the compute-bound limit."""
    formulas = []
    for name, label in STRATEGIES.items():
        p = rows[rows["problem"] == name]
        for pass_, pre, bound in _passes(p):
            formulas.append(
                {
                    "strategy": label,
                    "pass": pass_,
                    "FLOPs per device": formula(p, pre + "flops"),
                    "communication time": formula(p, pre + "comm_time"),
                    "compute-bound while": formula(p, bound),
                }
            )
    return md_table(pd.DataFrame(formulas))


def strategy_numbers(rows: pd.DataFrame) -> str:
    """Per strategy, pass, case, shape and device count: compute against communication."""
    numbers = []
    for name, label in STRATEGIES.items():
        p = rows[rows["problem"] == name]
        for pass_, pre, bound in _passes(p):
            for (case, shape), g in p.groupby(["case", "shape"], sort=False):
                for n, h in g.groupby("devices"):
                    comp, comm = quantity(h, pre + "compute_time"), quantity(h, pre + "comm_time")
                    numbers.append(
                        {
                            "case": case_label(case),
                            "shape": shape,
                            "strategy": label,
                            "pass": pass_,
                            "N": int(n),
                            "TFLOP per device": sig(quantity(h, pre + "flops") / 1e12),
                            "compute": ms(comp),
                            "communication": ms(comm),
                            "bound by": "communication" if comm > comp else "compute",
                            "max N": sig(quantity(h, bound)),
                        }
                    )
    return md_table(pd.DataFrame(numbers))


# ---- Q36: FSDP x TP ----------------------------------------------------------------------


def first_split(g: pd.DataFrame) -> dict[str, float]:
    """The quantities of a case and shape's first split (the bounds do not depend on it)."""
    one = g[(g["n_fsdp"] == g["n_fsdp"].iloc[0]) & (g["n_tp"] == g["n_tp"].iloc[0])]
    return {q: quantity(one, q) for q in one["quantity"]}


def fsdp_tp_bounds(rows: pd.DataFrame) -> str:
    """Per case and shape: the best split and the most devices, overlapped and serial."""
    bounds = []
    for (case, shape), g in rows.groupby(["case", "shape"], sort=False):
        vals = first_split(g)
        bounds.append(
            {
                "case": case_label(case),
                "shape": shape,
                "overlapped: N_FSDP, N_TP": f"{sig(vals['best_n_fsdp'])}, {sig(vals['best_n_tp'])}",
                "overlapped: max N": sig(vals["max_devices"]),
                "overlapped (large N)": sig(vals["max_devices_large_n"]),
                "serial: N_FSDP, N_TP": (
                    f"{sig(vals['serial_best_n_fsdp'])}, {sig(vals['serial_best_n_tp'])}"
                ),
                "serial: max N": sig(vals["serial_max_devices"]),
                "serial (large N)": sig(vals["serial_max_devices_large_n"]),
            }
        )
    return md_table(pd.DataFrame(bounds))


def fsdp_tp_times(rows: pd.DataFrame) -> str:
    """Per case, shape and split: compute against each axis's and both axes' communication."""
    times = []
    for (case, shape), g in rows.groupby(["case", "shape"], sort=False):
        for (nf, nt), h in g.groupby(["n_fsdp", "n_tp"], sort=False):
            comp = quantity(h, "forward_compute_time")
            over, serial = quantity(h, "comm_time_overlapped"), quantity(h, "comm_time_serial")
            times.append(
                {
                    "case": case_label(case),
                    "shape": shape,
                    "N_FSDP × N_TP": f"{int(nf)} × {int(nt)}",
                    "TFLOP per device": sig(quantity(h, "forward_flops") / 1e12),
                    "compute": ms(comp),
                    "T_FSDP": ms(quantity(h, "fsdp_comm_time")),
                    "T_TP": ms(quantity(h, "tp_comm_time")),
                    "overlapped": ms(over),
                    "serial": ms(serial),
                    "bound by (overlapped / serial)": (
                        f"{'communication' if over > comp else 'compute'} / "
                        f"{'communication' if serial > comp else 'compute'}"
                    ),
                }
            )
    return md_table(pd.DataFrame(times))


# ---- Q38: communication accounting (2025) ------------------------------------------------


def accounting_table(rows: pd.DataFrame) -> str:
    """Per variant of the mesh: the per-device and overall batch bounds and the memory."""
    table = [
        {
            "variant": variant,
            "X × Y": f"{int(g['n_fsdp'].iloc[0])} × {int(g['n_tp'].iloc[0])}",
            "weight bytes gathered": int(g["weight_bytes"].iloc[0]),
            "tokens per device ≥": sig(quantity(g, "batch_per_device")),
            "overall batch ≥ (tokens)": f"{quantity(g, 'batch'):,.0f}",
            "activations per device": gb(quantity(g, "activation_bytes")),
            "N_FSDP for 95 GB": sig(quantity(g, "min_devices")),
        }
        for variant, g in rows.groupby("variant", sort=False)
    ]
    return md_table(pd.DataFrame(table))


def accounting_formulas(base: pd.DataFrame) -> str:
    """The handout mesh's quantities: formula, value and unit (bytes as GB)."""
    formulas = base[["quantity", "formula", "value", "unit"]].copy()
    is_bytes = formulas["unit"] == "bytes"
    formulas["value"] = [
        sig(x / GB) if byt else sig(x) for x, byt in zip(formulas["value"], is_bytes, strict=True)
    ]
    formulas.loc[is_bytes, "unit"] = "GB"
    return md_table(formulas, numparse=False)


# ---- the ring model against the measurements ---------------------------------------------


def ring_rows(d: pd.DataFrame) -> pd.DataFrame:
    """The ring check's rows, `w_measured_here` marking the row W was measured from."""
    rows = problem(d, "ring_check")
    here = rows.get("w_measured_here", pd.Series(False, index=rows.index))
    return rows.assign(w_measured_here=here.fillna(False).astype(bool))


def ring_table(rows: pd.DataFrame) -> str:
    """Per backend, rank count and size: the model's time against the measured one."""
    table = []
    for case, c in rows.groupby("case", sort=False):
        backend = case.split("-", 1)[1]
        for n, g in c.groupby("devices", sort=False):
            for _, r in g.sort_values("message_mb").iterrows():
                table.append(
                    {
                        "backend": backend,
                        "ranks": int(n),
                        "buffers": r.get("buffers", "default"),
                        "size (MiB)": sig(r["message_mb"]),
                        "predicted ms": sig(r["predicted_ms"]),
                        "measured ms": sig(r["measured_ms"]),
                        "measured / predicted": "1× (W measured here)"
                        if r["w_measured_here"]
                        else f"{sig(r['value'])}×",
                    }
                )
    return md_table(pd.DataFrame(table))


def skipped_table(df: pd.DataFrame) -> str:
    """The problems and cases that did not run, with why."""
    skipped = df[df["status"] != "ok"]
    table = md_table(skipped[["problem", "case", "shape", "status"]].fillna("–").drop_duplicates())
    return table if len(skipped) else ""
