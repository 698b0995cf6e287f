"""The `arithmetic` section's answers in words, every number read from arithmetic.csv (rows.py
reads them): how far each strategy stays compute-bound (Q35), the best 2-D split overlapped and
serial (Q36), each part of the 2025 communication accounting (Q38), the ring model against the
measured all-reduce, and what a run without this machine's case leaves unanswered."""

from __future__ import annotations

import pandas as pd

from cs336_systems.reporting import questions
from cs336_systems.reporting.analysis import sig
from cs336_systems.stages.arithmetic.rows import (
    GB,
    STRATEGIES,
    case_label,
    first_split,
    formula,
    gb,
    quantity,
)


def strategy_sentences(rows: pd.DataFrame) -> list[str]:
    """One sentence per case and shape: the strategies' bounds side by side (they do not
    depend on N)."""
    sentences = []
    rows = rows[rows["problem"].isin(list(STRATEGIES))]
    for (case, shape), g in rows.groupby(["case", "shape"], sort=False):
        n0 = g["devices"].min()
        g = g[g["devices"] == n0]
        dp = quantity(g, "max_devices", problem="data_parallel_calcs")
        tpf = quantity(g, "forward_max_devices", problem="tp_calcs")
        tpb = quantity(g, "backward_max_devices", problem="tp_calcs")
        first = g.iloc[0]
        text = (
            f"{case_label(case)}, {shape} (B = {int(first['tokens']):,}, D = "
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
    return sentences


def fsdp_tp_sentences(rows: pd.DataFrame) -> list[str]:
    """Per case and shape: the best split with the two axes overlapped and sharing the links."""
    sentences = []
    for (case, shape), g in rows.groupby(["case", "shape"], sort=False):
        vals = first_split(g)
        clamped = min(vals["serial_best_n_fsdp"], vals["serial_best_n_tp"]) <= 1
        sentences.append(
            f"{case_label(case)}, {shape}: with the two axes overlapped the best split is N_FSDP = "
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
    return sentences


def accounting_setting(r0: pd.Series) -> str:
    """The model, the TPU and the mesh of the handout's communication accounting."""
    x, y = int(r0["n_fsdp"]), int(r0["n_tp"])
    return (
        f"XXL: D = {int(r0['d_model']):,}, D_FF = {int(r0['d_ff']):,}, L = {int(r0['blocks'])} "
        f"blocks of two linears; TPU v5p: C = {sig(r0['C_tflops'])} TFLOP/s, W_ici = "
        f"{sig(r0['W_gbps'])} GB/s, {r0['hbm_gb']:g} GB; mesh X = {x} (FSDP) × Y = {y} (TP), "
        f"M_X = {int(r0['m_x'])}, M_Y = {int(r0['m_y'])}; GB = 10^9 bytes, B counts tokens"
    )


def accounting_a(base: pd.DataFrame, v: dict[str, float]) -> str:
    """(a): the parameters, their training state and the activations backward needs."""
    n = int(base.iloc[0]["devices"])
    return (
        f"P = {formula(base, 'params').removeprefix('P = ')} = {v['params']:.3g} parameters; their "
        "fp32 master weights, accumulated gradients and AdamW's two moments (4 + 4 + 8 bytes a "
        f"parameter) take {formula(base, 'state_bytes')} = {gb(v['state_bytes'])}, "
        f"{sig(v['state_h100s'])} H100 80GB's worth. Backward needs the bf16 input of every "
        f"linear: {formula(base, 'activation_bytes_per_token')} = "
        f"{sig(v['activation_bytes_per_token'] / 1e6)} MB per token of the batch, "
        f"{gb(v['activation_bytes'] * n)} ({sig(v['activation_h100s'])} H100s) at the "
        f"compute-bound batch of (c), {v['batch']:,.0f} tokens: one device would need "
        f"{sig(v['state_h100s'] + v['activation_h100s'])} H100s' memory."
    )


def accounting_b(base: pd.DataFrame, v: dict[str, float]) -> str:
    """(b): the devices FSDP needs for the state to fit, and with the activations."""
    m = float(base.iloc[0]["hbm_gb"]) * GB
    n_state, n_all = v["min_devices_state"], v["min_devices"]
    return (
        f"Per device {formula(base, 'per_device_bytes')}, A = {formula(base, 'activation_bytes')} the "
        f"activations of the device's b tokens (half of them sharded). To fit {m / GB:g} GB, the "
        f"state alone needs {formula(base, 'min_devices_state')} = {sig(n_state)}, so "
        f"{int(-(-n_state // 1))} devices; with the activations of (c)'s per-device batch "
        f"({v['batch_per_device']:.0f} tokens, A = {gb(v['activation_bytes'])}), "
        f"{formula(base, 'min_devices')} = {sig(n_all)}: N_FSDP = {int(-(-n_all // 1))}, "
        f"{gb(v['per_device_bytes'])} a device. No N fits once A/2 reaches M: "
        f"{formula(base, 'max_tokens_per_device')} = {v['max_tokens_per_device']:,.0f} tokens."
    )


def accounting_c(base: pd.DataFrame, v: dict[str, float]) -> str:
    """(c): the per-device and overall batch that keeps the mesh compute-bound."""
    r0 = base.iloc[0]
    y, n = int(r0["n_tp"]), int(r0["devices"])
    b_dev = v["batch_per_device"]
    return (
        f"α = C / W_ici = {sig(v['alpha'])} FLOP per byte. Forward, per layer (the Scaling "
        "Book, part 5): T_math = 4 B D D_FF / (N C), T_FSDP = 4 D D_FF / (Y W_ici M_X) (the "
        "bf16 weights' Y-shards gathered over X), T_TP = 4 B D / (X W_ici M_Y); compute-bound "
        f"when both are below T_math: {formula(base, 'batch_per_device')} = {sig(b_dev)} tokens per "
        f"device, an overall batch {formula(base, 'batch')} = {v['batch']:,.0f} tokens "
        f"({int(-(-b_dev // 1)) * n:,} at {int(-(-b_dev // 1))} a device); the TP side holds: "
        f"Y = {y} ≤ {formula(base, 'max_tp').split('<= ')[1]} = {sig(v['max_tp'])}."
    )


def accounting_d(rows: pd.DataFrame, base: pd.DataFrame, v: dict[str, float]) -> str:
    """(d): how the other meshes and 8-bit gathers lower the batch bound, and what else would."""
    n = int(base.iloc[0]["devices"])
    alts = []
    for variant, g in rows[rows["variant"] != "handout"].groupby("variant", sort=False):
        gg = {q: quantity(g, q) for q in g["quantity"]}
        alts.append(
            f"{variant} (X = {int(g['n_fsdp'].iloc[0])}, Y = {int(g['n_tp'].iloc[0])}, "
            f"{int(g['weight_bytes'].iloc[0])}-byte weights gathered): "
            f"{sig(gg['batch_per_device'])} tokens a device, {gg['batch']:,.0f} in all"
        )
    return (
        "The bound b ≥ C / (W_ici M_X Y) falls with the bytes the FSDP all-gather moves per "
        f"FLOP. At the same {n} devices: " + "; ".join(alts) + " (the handout's mesh: "
        f"{sig(v['batch_per_device'])} and {v['batch']:,.0f}). More tensor parallelism divides "
        "each device's weight shard, and so the FSDP traffic, by Y, while the TP all-reduce "
        f"stays hidden up to Y = {sig(v['max_tp'])}; gathering 8-bit weights halves T_FSDP. "
        "Beyond these, pipeline parallelism splits the layers over stages so that a device "
        "gathers only its stage's weights, at the price of micro-batches that keep the pipeline "
        "full (the Ultra-Scale Playbook's appendix), and laying the FSDP axis over more of the "
        "torus's physical axes raises M_X (the Scaling Book, part 5)."
    )


def ring_sentences(rows: pd.DataFrame) -> list[str]:
    """Per backend and rank count: the measured time against the model's at the largest and
    smallest sizes, after the sentence saying which row W comes from."""
    sentences = []
    for case, c in rows.groupby("case", sort=False):
        backend = case.split("-", 1)[1]
        src = c[c["w_measured_here"]]
        for n, g in c.groupby("devices", sort=False):
            g = g.sort_values("message_mb")
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
    return sentences


def coverage(skipped: pd.DataFrame) -> dict:
    """Section 8's questions answered for the B200 case only, this machine's being `skipped`."""
    why = "; ".join(sorted(set(skipped["status"])))
    return {
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
