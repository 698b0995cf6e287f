"""Report context for the `arithmetic` stage: each answer of the handout's communication
arithmetic as a formula and as numbers, every number and sentence read from arithmetic.csv."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cs336_systems.core import questions
from cs336_systems.core.analysis import load, md_table, ok, plot_main, sig

STRATEGIES = {"data_parallel_calcs": "DP", "fsdp_calcs": "FSDP", "tp_calcs": "TP"}
UNIT = {"s": 1e3, "FLOP": 1e-12}  # shown as ms and TFLOP


def plot(results_dir: Path, fig_dir: Path) -> list[Path]:
    return []


def _case_label(case: str, df: pd.DataFrame) -> str:
    if case == "b200":
        return "B200 (handout)"
    backend = case.split("-", 1)[1]
    return f"this machine ({backend})"


def _v(rows: pd.DataFrame, quantity: str, **where) -> float:
    r = rows[rows["quantity"] == quantity]
    for k, v in where.items():
        r = r[r[k] == v]
    return float(r["value"].iloc[0]) if len(r) else float("nan")


def _f(rows: pd.DataFrame, quantity: str) -> str:
    r = rows[rows["quantity"] == quantity]
    return str(r["formula"].iloc[0]) if len(r) else "–"


def _ms(x: float) -> str:
    return f"{sig(x * 1e3)} ms"


def q34(d: pd.DataFrame) -> dict:
    rows = d[d["problem"] == "alternate_ring_all_reduce"]
    if not len(rows):
        return {}
    out = []
    for case, g in rows.groupby("case", sort=False):
        g = g[g["shape"] == g["shape"].iloc[0]]
        for n, h in g.groupby("devices"):
            t, ring = _v(h, "time"), _v(h, "ring_time")
            out.append(
                {
                    "case": _case_label(case, d),
                    "W GB/s": sig(h["W_gbps"].iloc[0]),
                    "N": int(n),
                    "S MB": sig(h["message_mb"].iloc[0]),
                    "alternate (N-1) S/W": _ms(t),
                    "ring 2 (N-1)/N S/W": _ms(ring),
                    "alternate / ring": f"{sig(t / ring)}×",
                }
            )
    return {
        "formula": _f(rows, "time"),
        "ring_formula": _f(rows, "ring_time"),
        "slowdown_formula": _f(rows, "slowdown"),
        "table": md_table(pd.DataFrame(out)),
        "equal_at_two": bool((rows[rows["quantity"] == "slowdown"]["value"] == 1.0).any()),
    }


def _strategy_tables(d: pd.DataFrame) -> tuple[str, str, list[str]]:
    """The formula table, the numbers table and one sentence per case and shape."""
    formulas, numbers, sentences = [], [], []
    rows = d[d["problem"].isin(list(STRATEGIES))]
    for problem, label in STRATEGIES.items():
        p = rows[rows["problem"] == problem]
        for pass_ in ("forward", "backward"):
            pre = f"{pass_}_"
            if not (p["quantity"] == pre + "comm_time").any():
                continue
            bound = (
                pre + "max_devices"
                if (p["quantity"] == pre + "max_devices").any()
                else "max_devices"
            )
            formulas.append(
                {
                    "strategy": label,
                    "pass": pass_,
                    "FLOPs per device": _f(p, pre + "flops"),
                    "communication time": _f(p, pre + "comm_time"),
                    "compute-bound while": _f(p, bound),
                }
            )
            for (case, shape), g in p.groupby(["case", "shape"], sort=False):
                for n, h in g.groupby("devices"):
                    comp, comm = _v(h, pre + "compute_time"), _v(h, pre + "comm_time")
                    numbers.append(
                        {
                            "case": _case_label(case, d),
                            "shape": shape,
                            "strategy": label,
                            "pass": pass_,
                            "N": int(n),
                            "TFLOP per device": sig(_v(h, pre + "flops") / 1e12),
                            "compute": _ms(comp),
                            "communication": _ms(comm),
                            "bound by": "communication" if comm > comp else "compute",
                            "max N": sig(_v(h, bound)),
                        }
                    )
    # one sentence per case and shape: the bounds side by side (they do not depend on N)
    for (case, shape), g in rows.groupby(["case", "shape"], sort=False):
        n0 = g["devices"].min()
        g = g[g["devices"] == n0]
        dp = _v(g, "max_devices", problem="data_parallel_calcs")
        tpf = _v(g, "forward_max_devices", problem="tp_calcs")
        tpb = _v(g, "backward_max_devices", problem="tp_calcs")
        first = g.iloc[0]
        text = (
            f"{_case_label(case, d)}, {shape} (B = {int(first['tokens']):,}, D = "
            f"{int(first['d_model']):,}, D_FF = {int(first['d_ff']):,}; C = "
            f"{sig(first['C_tflops'])} TFLOP/s, W = {sig(first['W_gbps'])} GB/s): DP and FSDP "
            f"stay compute-bound up to N = {sig(dp)} devices, TP up to {sig(tpf)} in forward "
            f"and {sig(tpb)} in backward"
        )
        if dp < 2:
            text += "; data parallelism is communication-bound already on two devices"
        if tpf < 2:
            text += "; tensor parallelism's forward is communication-bound already on two"
        sentences.append(text + ".")
    return md_table(pd.DataFrame(formulas)), md_table(pd.DataFrame(numbers)), sentences


def q35(d: pd.DataFrame) -> dict:
    if not d["problem"].isin(list(STRATEGIES)).any():
        return {}
    formulas, numbers, sentences = _strategy_tables(d)
    return {"formulas": formulas, "table": numbers, "sentences": sentences}


def q36(d: pd.DataFrame) -> dict:
    rows = d[d["problem"] == "fsdp_tp_calcs"]
    if not len(rows):
        return {}
    bounds, times, sentences = [], [], []
    for (case, shape), g in rows.groupby(["case", "shape"], sort=False):
        one = g[(g["n_fsdp"] == g["n_fsdp"].iloc[0]) & (g["n_tp"] == g["n_tp"].iloc[0])]
        label = _case_label(case, d)
        vals = {q: _v(one, q) for q in one["quantity"]}
        bounds.append(
            {
                "case": label,
                "shape": shape,
                "overlapped: N_FSDP, N_TP": f"{sig(vals['best_n_fsdp'])}, {sig(vals['best_n_tp'])}",
                "overlapped: max N": sig(vals["max_devices"]),
                "(large N)": sig(vals["max_devices_large_n"]),
                "serial: N_FSDP, N_TP": (
                    f"{sig(vals['serial_best_n_fsdp'])}, {sig(vals['serial_best_n_tp'])}"
                ),
                "serial: max N": sig(vals["serial_max_devices"]),
            }
        )
        sentences.append(
            f"{label}, {shape}: with the two axes overlapped the best split is N_FSDP = "
            f"{sig(vals['best_n_fsdp'])}, N_TP = {sig(vals['best_n_tp'])}, up to "
            f"N = {sig(vals['max_devices'])} devices; sharing the links, "
            f"N = {sig(vals['serial_max_devices'])} "
            f"({sig(vals['max_devices_large_n'] / vals['serial_max_devices'])}× fewer than the "
            "large-N overlapped bound)"
            + (
                "; below two devices, the FFN is communication-bound on any 2-D split"
                if vals["max_devices"] < 2
                else ""
            )
            + "."
        )
        for (nf, nt), h in g.groupby(["n_fsdp", "n_tp"], sort=False):
            comp = _v(h, "forward_compute_time")
            over, serial = _v(h, "comm_time_overlapped"), _v(h, "comm_time_serial")
            times.append(
                {
                    "case": label,
                    "shape": shape,
                    "N_FSDP × N_TP": f"{int(nf)} × {int(nt)}",
                    "TFLOP per device": sig(_v(h, "forward_flops") / 1e12),
                    "compute": _ms(comp),
                    "T_FSDP": _ms(_v(h, "fsdp_comm_time")),
                    "T_TP": _ms(_v(h, "tp_comm_time")),
                    "overlapped": _ms(over),
                    "serial": _ms(serial),
                    "bound by (overlapped / serial)": (
                        f"{'communication' if over > comp else 'compute'} / "
                        f"{'communication' if serial > comp else 'compute'}"
                    ),
                }
            )
    formulas = {
        q: _f(rows, q)
        for q in (
            "forward_flops",
            "fsdp_comm_time",
            "tp_comm_time",
            "comm_time_overlapped",
            "comm_time_serial",
            "max_devices",
            "max_devices_large_n",
            "serial_max_devices",
        )
    }
    return {
        "formulas": formulas,
        "bounds": md_table(pd.DataFrame(bounds)),
        "times": md_table(pd.DataFrame(times)),
        "sentences": sentences,
    }


def ring(d: pd.DataFrame) -> dict:
    rows = d[d["problem"] == "ring_check"]
    if not len(rows):
        return {}
    table, sentences = [], []
    for (case, n), g in rows.groupby(["case", "devices"], sort=False):
        g = g.sort_values("message_mb")
        for _, r in g.iterrows():
            table.append(
                {
                    "backend": case.split("-", 1)[1],
                    "ranks": int(n),
                    "buffers": r.get("buffers", "default"),
                    "size MB": sig(r["message_mb"]),
                    "predicted ms": sig(r["predicted_ms"]),
                    "measured ms": sig(r["measured_ms"]),
                    "measured / predicted": f"{sig(r['value'])}×",
                }
            )
        big, small = g.iloc[-1], g.iloc[0]
        sentences.append(
            f"{case.split('-', 1)[1]} (W = {sig(big['W_gbps'])} GB/s), {int(n)} ranks: at {sig(big['message_mb'])} MB the "
            f"measured time is {sig(big['value'])}× the model's, at {sig(small['message_mb'])} MB "
            f"{sig(small['value'])}×"
            + (
                " (the model has no per-call latency, which small messages pay)"
                if small["value"] > 1.5 * big["value"]
                else ""
            )
            + "."
        )
    return {
        "sources": list(dict.fromkeys(rows["source"].astype(str))),
        "table": md_table(pd.DataFrame(table)),
        "sentences": sentences,
    }


def context(results_dir: Path) -> dict:
    df = load(results_dir, "arithmetic")
    if len(df) == 0:
        return {"available": False}
    good = ok(df)
    skipped = df[df["status"] != "ok"]
    skipped_table = md_table(
        skipped[["problem", "case", "shape", "status"]].fillna("–").drop_duplicates()
    )
    cases = [c for c in df["case"].drop_duplicates() if c != "b200"]
    measured_ok = [c for c in cases if (good["case"] == c).any()]
    sources = {
        _case_label(c, df): str(good[good["case"] == c]["source"].iloc[0])
        for c in good["case"].drop_duplicates()
    }
    ctx = {
        "available": True,
        "q34": q34(good),
        "q35": q35(good),
        "q36": q36(good),
        "ring": ring(good),
        "sources": sources,
        "skipped": skipped_table if len(skipped) else "",
        "measured_missing": [c for c in cases if c not in measured_ok],
    }
    if ctx["measured_missing"]:
        why = "; ".join(sorted(set(skipped["status"])))
        ctx["coverage"] = {
            q: {
                "status": "partly",
                "why": f"the B200 case is answered; this machine's case is not ({why})",
                "how": (
                    "a run on one host with 2 or more GPUs (the allreduce stage's NCCL rows)"
                    if "nccl" in why
                    else "add the ceilings and allreduce stages to the run"
                ),
            }
            for q in questions.declarations()["arithmetic"]
            if not q.startswith("communication_accounting")
        }
    return ctx


if __name__ == "__main__":
    plot_main(plot)
