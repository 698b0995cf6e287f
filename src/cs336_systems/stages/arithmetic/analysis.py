"""Report context for the `arithmetic` stage: each answer of the handout's communication
arithmetic as a formula and as numbers, every number and sentence read from arithmetic.csv."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cs336_systems.reporting import questions
from cs336_systems.reporting.analysis import load, md_table, ok, plot_main, sig

STRATEGIES = {"data_parallel_calcs": "DP", "fsdp_calcs": "FSDP", "tp_calcs": "TP"}
UNIT = {"s": 1e3, "FLOP": 1e-12}  # shown as ms and TFLOP


def plot(results_dir: Path, fig_dir: Path) -> list[Path]:
    return []


def _case_label(case: str, df: pd.DataFrame) -> str:
    if case == "b200":
        return "B200 (handout)"
    if case.startswith("tpu-"):
        return f"TPU {case.removeprefix('tpu-')} (handout)"
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
                "overlapped (large N)": sig(vals["max_devices_large_n"]),
                "serial: N_FSDP, N_TP": (
                    f"{sig(vals['serial_best_n_fsdp'])}, {sig(vals['serial_best_n_tp'])}"
                ),
                "serial: max N": sig(vals["serial_max_devices"]),
                "serial (large N)": sig(vals["serial_max_devices_large_n"]),
            }
        )
        clamped = min(vals["serial_best_n_fsdp"], vals["serial_best_n_tp"]) <= 1
        sentences.append(
            f"{label}, {shape}: with the two axes overlapped the best split is N_FSDP = "
            f"{sig(vals['best_n_fsdp'])}, N_TP = {sig(vals['best_n_tp'])}, up to "
            f"N = {sig(vals['max_devices'])} devices; sharing the links, N_FSDP = "
            f"{sig(vals['serial_best_n_fsdp'])}, N_TP = {sig(vals['serial_best_n_tp'])}, up to "
            f"N = {sig(vals['serial_max_devices'])} "
            f"({sig(vals['max_devices'] / vals['serial_max_devices'])}× fewer)"
            + (
                " (the balanced split would put "
                + ("FSDP" if vals["serial_best_n_fsdp"] <= 1 else "TP")
                + " below one device, so that axis stays 1 and the other takes the whole "
                "budget: the large-N form 3 B D_FF W² / (8 C²) = "
                f"{sig(vals['serial_max_devices_large_n'])} does not hold here)"
                if clamped
                else ""
            )
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
            "serial_best_n_fsdp",
            "serial_best_n_tp",
            "serial_max_devices",
            "serial_max_devices_large_n",
        )
    }
    return {
        "formulas": formulas,
        "bounds": md_table(pd.DataFrame(bounds)),
        "times": md_table(pd.DataFrame(times)),
        "sentences": sentences,
    }


GB = 1e9  # the handout's GB (its 80 GB H100 and 95 GB TPU v5p)


def _gb(x: float) -> str:
    return f"{sig(x / GB)} GB"


def q38(d: pd.DataFrame) -> dict:
    """communication_accounting (2025): each part's answer from the rows of the handout's mesh,
    part (d) from the variants'."""
    rows = d[d["problem"] == "communication_accounting"]
    if not len(rows):
        return {}
    base = rows[rows["variant"] == "handout"]
    v = {q: _v(base, q) for q in base["quantity"]}
    r0 = base.iloc[0]
    x, y, n = int(r0["n_fsdp"]), int(r0["n_tp"]), int(r0["devices"])
    m = float(r0["hbm_gb"]) * GB
    b_dev, batch = v["batch_per_device"], v["batch"]
    n_state, n_all = v["min_devices_state"], v["min_devices"]
    setting = (
        f"XXL: D = {int(r0['d_model']):,}, D_FF = {int(r0['d_ff']):,}, L = {int(r0['blocks'])} "
        f"blocks of two linears; TPU v5p: C = {sig(r0['C_tflops'])} TFLOP/s, W_ici = "
        f"{sig(r0['W_gbps'])} GB/s, {r0['hbm_gb']:g} GB; mesh X = {x} (FSDP) × Y = {y} (TP), "
        f"M_X = {int(r0['m_x'])}, M_Y = {int(r0['m_y'])}; GB = 10^9 bytes, B counts tokens"
    )
    a = (
        f"P = {_f(base, 'params').removeprefix('P = ')} = {v['params']:.3g} parameters; their "
        "fp32 master weights, accumulated gradients and AdamW's two moments (4 + 4 + 8 bytes a "
        f"parameter) take {_f(base, 'state_bytes')} = {_gb(v['state_bytes'])}, "
        f"{sig(v['state_h100s'])} H100 80GB's worth. Backward needs the bf16 input of every "
        f"linear: {_f(base, 'activation_bytes_per_token')} = "
        f"{sig(v['activation_bytes_per_token'] / 1e6)} MB per token of the batch, "
        f"{_gb(v['activation_bytes'] * n)} ({sig(v['activation_h100s'])} H100s) at the "
        f"compute-bound batch of (c), {batch:,.0f} tokens: one device would need "
        f"{sig(v['state_h100s'] + v['activation_h100s'])} H100s' memory."
    )
    b = (
        f"Per device {_f(base, 'per_device_bytes')}, A = {_f(base, 'activation_bytes')} the "
        f"activations of the device's b tokens (half of them sharded). To fit {m / GB:g} GB, the "
        f"state alone needs {_f(base, 'min_devices_state')} = {sig(n_state)}, so "
        f"{int(-(-n_state // 1))} devices; with the activations of (c)'s per-device batch "
        f"({b_dev:.0f} tokens, A = {_gb(v['activation_bytes'])}), "
        f"{_f(base, 'min_devices')} = {sig(n_all)}: N_FSDP = {int(-(-n_all // 1))}, "
        f"{_gb(v['per_device_bytes'])} a device. No N fits once A/2 reaches M: "
        f"{_f(base, 'max_tokens_per_device')} = {v['max_tokens_per_device']:,.0f} tokens."
    )
    c = (
        f"α = C / W_ici = {sig(v['alpha'])} FLOP per byte. Forward, per layer (the Scaling "
        "Book, part 5): T_math = 4 B D D_FF / (N C), T_FSDP = 4 D D_FF / (Y W_ici M_X) (the "
        "bf16 weights' Y-shards gathered over X), T_TP = 4 B D / (X W_ici M_Y); compute-bound "
        f"when both are below T_math: {_f(base, 'batch_per_device')} = {sig(b_dev)} tokens per "
        f"device, an overall batch {_f(base, 'batch')} = {batch:,.0f} tokens "
        f"({int(-(-b_dev // 1)) * n:,} at {int(-(-b_dev // 1))} a device); the TP side holds: "
        f"Y = {y} ≤ {_f(base, 'max_tp').split('<= ')[1]} = {sig(v['max_tp'])}."
    )
    alts = []
    for variant, g in rows[rows["variant"] != "handout"].groupby("variant", sort=False):
        gg = {q: _v(g, q) for q in g["quantity"]}
        alts.append(
            f"{variant} (X = {int(g['n_fsdp'].iloc[0])}, Y = {int(g['n_tp'].iloc[0])}, "
            f"{int(g['weight_bytes'].iloc[0])}-byte weights gathered): "
            f"{sig(gg['batch_per_device'])} tokens a device, {gg['batch']:,.0f} in all"
        )
    dpar = (
        "The bound b ≥ C / (W_ici M_X Y) falls with the bytes the FSDP all-gather moves per "
        f"FLOP. At the same {n} devices: " + "; ".join(alts) + " (the handout's mesh: "
        f"{sig(b_dev)} and {batch:,.0f}). More tensor parallelism divides each device's weight "
        "shard, and so the FSDP traffic, by Y, while the TP all-reduce stays hidden up to "
        f"Y = {sig(v['max_tp'])}; gathering 8-bit weights halves T_FSDP. Beyond these, "
        "pipeline parallelism splits the layers over stages so that a device gathers only its "
        "stage's weights, at the price of micro-batches that keep the pipeline full (the "
        "Ultra-Scale Playbook's appendix), and laying the FSDP axis over more of the torus's "
        "physical axes raises M_X (the Scaling Book, part 5)."
    )
    table = [
        {
            "variant": variant,
            "X × Y": f"{int(g['n_fsdp'].iloc[0])} × {int(g['n_tp'].iloc[0])}",
            "weight bytes gathered": int(g["weight_bytes"].iloc[0]),
            "tokens per device ≥": sig(_v(g, "batch_per_device")),
            "overall batch ≥ (tokens)": f"{_v(g, 'batch'):,.0f}",
            "activations per device": _gb(_v(g, "activation_bytes")),
            "N_FSDP for 95 GB": sig(_v(g, "min_devices")),
        }
        for variant, g in rows.groupby("variant", sort=False)
    ]
    formulas = base[["quantity", "formula", "value", "unit"]].copy()
    is_bytes = formulas["unit"] == "bytes"
    formulas["value"] = [
        sig(x / GB) if byt else sig(x) for x, byt in zip(formulas["value"], is_bytes, strict=True)
    ]
    formulas.loc[is_bytes, "unit"] = "GB"
    return {
        "setting": setting,
        "a": a,
        "b": b,
        "c": c,
        "d": dpar,
        "table": md_table(pd.DataFrame(table)),
        "formulas": md_table(formulas, numparse=False),
    }


def ring(d: pd.DataFrame) -> dict:
    rows = d[d["problem"] == "ring_check"]
    if not len(rows):
        return {}
    table, sentences = [], []
    here = rows.get("w_measured_here", pd.Series(False, index=rows.index))
    rows = rows.assign(w_measured_here=here.fillna(False).astype(bool))
    for case, c in rows.groupby("case", sort=False):
        backend = case.split("-", 1)[1]
        src = c[c["w_measured_here"]]
        for n, g in c.groupby("devices", sort=False):
            g = g.sort_values("message_mb")
            for _, r in g.iterrows():
                table.append(
                    {
                        "backend": backend,
                        "ranks": int(n),
                        "buffers": r.get("buffers", "default"),
                        "size MB": sig(r["message_mb"]),
                        "predicted ms": sig(r["predicted_ms"]),
                        "measured ms": sig(r["measured_ms"]),
                        "measured / predicted": "1× (W measured here)"
                        if r["w_measured_here"]
                        else f"{sig(r['value'])}×",
                    }
                )
            # the row W comes from matches by construction: the check is every other row
            g = g[~g["w_measured_here"]]
            if not len(g):
                continue
            big, small = g.iloc[-1], g.iloc[0]
            text = (
                f"{backend}, {int(n)} ranks: at {sig(big['message_mb'])} MB the measured time "
                f"is {sig(big['value'])}× the model's"
            )
            if len(g) > 1:
                text += f", at {sig(small['message_mb'])} MB {sig(small['value'])}×" + (
                    " (the model has no per-call latency, which small messages pay)"
                    if small["value"] > 1.5 * big["value"]
                    else ""
                )
            sentences.append(text + ".")
        if len(src):
            r = src.iloc[0]
            sentences.insert(
                0,
                f"{backend}: W = {sig(r['W_gbps'])} GB/s is the bus bandwidth of the "
                f"{int(r['devices'])}-rank all-reduce of {sig(r['message_mb'])} MB, so the model "
                "equals the measurement there by construction; the other rows test it.",
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
    if "edition" in df and set(df["edition"].astype(str)) == {"2025"}:
        # a 2025 run answers its own problem only: section 8's problems are the 2026 handout's
        df = df[df["problem"] == "communication_accounting"]
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
        "q38": q38(good),
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
