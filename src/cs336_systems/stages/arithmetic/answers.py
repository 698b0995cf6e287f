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
                f"{backend}, {int(n)} ranks: at {sig(big['message_mb'])} MiB the measured time "
                f"is {sig(big['value'])}× the model's"
            )
            if len(g) > 1:
                text += f", at {sig(small['message_mb'])} MiB {sig(small['value'])}×" + (
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
                f"{int(r['devices'])}-rank all-reduce of {sig(r['message_mb'])} MiB, so the model "
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


# ---- each calc's one-sentence justification (the handout asks one per answer) -------------

# (problem, part, quantity whose formula is the answer, the justification): the formula is read
# from the rows (core/costs.py wrote it), the sentence says why it holds
JUSTIFIED = [
    ("alternate_ring_all_reduce", "", "time",
     "in each of the N-1 steps every device sends a whole tensor of S bytes (not a chunk of "
     "S/N) through its link of W bytes/s, so each step takes S/W."),
    ("data_parallel_calcs", "a", "backward_flops",
     "each device runs the backward's six matmuls (dz, the two terms of dx, dW1, dW2, dW3) on "
     "its B/N_DP rows, each 2 (B/N_DP) D D_FF FLOPs."),
    ("data_parallel_calcs", "b", "backward_comm_time",
     "the ring all-reduce of the three weight gradients (3 D D_FF values of 2 bytes) sends "
     "2 (N_DP-1)/N_DP of their 6 D D_FF bytes through each device's link of W bytes/s."),
    ("data_parallel_calcs", "c", "max_devices",
     "communication hides behind compute while 12 (N_DP-1) D D_FF / (N_DP W) <= "
     "12 B D D_FF / (N_DP C), which is N_DP - 1 <= B W / C."),
    ("fsdp_calcs", "a", "backward_flops",
     "with the weights all-gathered, each device runs data parallelism's backward on its batch "
     "shard: six matmuls of 2 (B/N_FSDP) D D_FF FLOPs."),
    ("fsdp_calcs", "a", "forward_flops",
     "the forward's three matmuls (x W1, x W2, z W3) on the device's B/N_FSDP rows, "
     "2 (B/N_FSDP) D D_FF FLOPs each."),
    ("fsdp_calcs", "b", "backward_comm_time",
     "the three weights (6 D D_FF bytes) are all-gathered again and their gradients "
     "reduce-scattered, each collective sending (N_FSDP-1)/N_FSDP of those bytes through each "
     "device's link of W bytes/s."),
    ("fsdp_calcs", "b", "forward_comm_time",
     "only the three weights are all-gathered: (N_FSDP-1)/N_FSDP of their 6 D D_FF bytes "
     "through each device's link of W bytes/s."),
    ("fsdp_calcs", "c", "backward_max_devices",
     "12 (N_FSDP-1) D D_FF / (N_FSDP W) <= 12 B D D_FF / (N_FSDP C) is N_FSDP - 1 <= B W / C."),
    ("fsdp_calcs", "c", "forward_max_devices",
     "6 (N_FSDP-1) D D_FF / (N_FSDP W) <= 6 B D D_FF / (N_FSDP C): half the traffic for half "
     "the compute, the same bound."),
    ("tp_calcs", "b", "forward_flops",
     "each device multiplies the whole batch by its D_FF/N_TP columns of W1 and W2 and rows of "
     "W3: three matmuls of 2 B D D_FF / N_TP FLOPs."),
    ("tp_calcs", "b", "backward_flops",
     "each of those three matmuls has an input-gradient and a weight-gradient matmul of its "
     "size: twice the forward."),
    ("tp_calcs", "c", "forward_comm_time",
     "one ring all-reduce of the output y (B D values of 2 bytes) sends 2 (N_TP-1)/N_TP of its "
     "2 B D bytes through each device's link of W bytes/s."),
    ("tp_calcs", "c", "backward_comm_time",
     "one all-reduce of dx (the sum over the devices' D_FF slices of dx1 W1ᵀ + dx2 W2ᵀ), the "
     "size of y; the weight gradients stay local."),
    ("tp_calcs", "d", "backward_max_devices",
     "4 (N_TP-1) B D / (N_TP W) <= 12 B D D_FF / (N_TP C) is N_TP - 1 <= 3 D_FF W / C."),
    ("tp_calcs", "d", "forward_max_devices",
     "4 (N_TP-1) B D / (N_TP W) <= 6 B D D_FF / (N_TP C) is N_TP - 1 <= 3 D_FF W / (2 C): the "
     "same traffic against half the compute."),
    ("fsdp_tp_calcs", "a", "forward_flops",
     "each device runs tensor parallelism's forward (6 B' D D_FF / N_TP) on its batch shard "
     "B' = B / N_FSDP."),
    ("fsdp_tp_calcs", "b", "comm_time_overlapped",
     "the FSDP axis all-gathers each device's TP slice of the weights (T_FSDP), the TP axis "
     "all-reduces the B/N_FSDP x D output (T_TP), and the two overlap, so the slower sets the "
     "time."),
    ("fsdp_tp_calcs", "c", "max_devices",
     "overlapped, each axis must hide behind the compute on its own: T_FSDP <= compute is "
     "N_FSDP - 1 <= B W / C and T_TP <= compute is N_TP - 1 <= 3 D_FF W / (2 C), independent "
     "bounds whose product is the largest N."),
    ("fsdp_tp_calcs", "d", "serial_max_devices",
     "sharing the links, T_FSDP + T_TP <= compute is 3 D_FF (N_FSDP-1) + 2 B (N_TP-1) <= "
     "3 B D_FF W / C, and the product N_FSDP N_TP under this linear budget is largest where "
     "its two terms are equal."),
]  # fmt: skip


def justified(rows: pd.DataFrame) -> list[dict]:
    """Each calc the rows answer, in the handout's order: its part, the answer (the formula the
    rows carry) and its one-sentence justification."""
    out = []
    for problem, part, name, why in JUSTIFIED:
        p = rows[rows["problem"] == problem]
        if not (p["quantity"] == name).any():
            continue
        out.append(
            {
                "part": f"{problem} ({part})" if part else problem,
                "answer": formula(p, name),
                "why": why,
            }
        )
    return out


def activation(rows: pd.DataFrame) -> dict:
    """memory_profiling (d): one fp32 residual-stream activation of the handout's model, with
    its derivation and justification, at each context the rows evaluate."""
    r0 = rows.iloc[0]
    b, d = int(r0["batch_size"]), int(r0["d_model"])
    sizes = [
        f"{sig(v)} MiB at context {int(t):,}"
        for t, v in zip(rows["context_length"], rows["value"], strict=True)
    ]
    ref = rows[rows["context_length"] == 512]
    at = ref.iloc[0] if len(ref) else r0
    t = int(at["context_length"])
    return {
        "model": str(r0["size"]),
        "text": (
            f"The residual stream between two blocks of the {r0['size']} model (d_model = "
            f"{d:,}) holds one fp32 value per token and feature: B x T x d_model x 4 bytes = "
            f"{b} x {t:,} x {d:,} x 4 = {b * t * d * 4:,} bytes = {sig(at['value'])} MiB at "
            f"the reference batch {b} and context {t:,}; it grows linearly with the context: "
            f"{', '.join(sizes)}."
        ),
        "source": str(r0["source"]),
    }
