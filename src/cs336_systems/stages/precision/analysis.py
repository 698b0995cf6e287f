"""Report context and figures for the `precision` stage (questions 10-12, and bf16 vs fp32
speed and memory from the benchmark and memory stages)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from cs336_systems.reporting.analysis import (
    SIZE_ORDER,
    empty_figure,
    load,
    md_table,
    ok,
    plot_main,
    save,
)

TENSOR_ORDER = [
    "fc1.weight",
    "ln.weight",
    "ln.bias",
    "fc2.weight",
    "fc1 output",
    "ReLU output",
    "LayerNorm output",
    "logits (fc2 output)",
    "loss",
    "fc1.weight.grad",
    "ln.weight.grad",
    "ln.bias.grad",
    "fc2.weight.grad",
]
MODE_LABEL = {
    "forward": "forward",
    "forward_backward": "forward+backward",
    "train_step": "train step",
}
QUANTITY_LABEL = {
    "mean": "mean",
    "variance": "variance",
    "variance_naive": "variance as E[x²]−E[x]²",
    "output": "normalized output",
}


def _exact(x: float) -> str:
    """Every digit of a float, as code (so table formatting leaves it alone)."""
    return f"`{float(x)!r}`"


def plot(results_dir: Path, fig_dir: Path) -> list[Path]:
    acc = ok(load(results_dir, "precision"))
    ln = ok(load(results_dir, "precision_layernorm"))
    fig_dir = Path(fig_dir)
    paths = {n: fig_dir / f"precision_{n}.png" for n in ("accumulation", "layernorm")}
    out = []
    if acc.empty:
        out.append(empty_figure(paths["accumulation"], "no accumulation data"))
    else:
        fig, ax = plt.subplots(figsize=(7, 3.6))
        devices = sorted(acc["device"].unique())
        variants = list(dict.fromkeys(acc["variant"]))
        width = 0.8 / len(devices)
        for i, dev in enumerate(devices):
            a = acc[acc["device"] == dev].set_index("variant").reindex(variants)
            err = a["abs_error"].clip(lower=1e-16)
            ax.bar(np.arange(len(variants)) + i * width, err, width, label=dev)
        ax.set_xticks(np.arange(len(variants)) + width * (len(devices) - 1) / 2)
        ax.set_xticklabels(variants, rotation=30, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("|sum − 10|")
        ax.set_title("0.01 added 1000 times", fontsize=10)
        ax.legend(fontsize=8)
        out.append(save(fig, paths["accumulation"]))
    if ln.empty:
        out.append(empty_figure(paths["layernorm"], "no LayerNorm data"))
    else:
        d = ln[ln["device"] == sorted(ln["device"].unique())[-1]]
        cases = list(dict.fromkeys(zip(d["offset"], d["spread"], strict=True)))
        fig, axes = plt.subplots(1, len(cases), figsize=(3.4 * len(cases), 3.6), sharey=True)
        axes = np.atleast_1d(axes)
        quantities = list(QUANTITY_LABEL)
        dtypes = ["fp32", "bf16", "fp16"]
        width = 0.8 / len(dtypes)
        for ax, (off, spread) in zip(axes, cases, strict=True):
            c = d[(d["offset"] == off) & (d["spread"] == spread)]
            for j, dt in enumerate(dtypes):
                cd = c[c["dtype"] == dt].set_index("quantity").reindex(quantities)
                vals = cd["max_error"].fillna(1e3).clip(lower=1e-9)
                x = np.arange(len(quantities)) + j * width
                ax.bar(x, vals, width, label=dt)
                for xi, nf in zip(x, cd["nonfinite_fraction"], strict=True):
                    if nf and nf > 0:
                        ax.text(xi, 2e3, "inf/nan", rotation=90, fontsize=6, ha="center")
            ax.set_xticks(np.arange(len(quantities)) + width)
            ax.set_xticklabels(["mean", "var", "var naive", "output"], fontsize=8)
            ax.set_yscale("log")
            ax.set_ylim(1e-9, 1e6)
            ax.set_title(f"x ~ {off:g} + {spread:g}·N(0,1)", fontsize=9)
        axes[0].set_ylabel("max error vs fp64")
        axes[-1].legend(fontsize=8)
        out.append(save(fig, paths["layernorm"]))
    return out


def _accumulation(acc: pd.DataFrame) -> dict:
    s: dict = {}
    dev = "cuda" if (acc["device"] == "cuda").any() else "cpu"
    a = acc[acc["device"] == dev].set_index("variant")
    show = acc[
        [
            "device",
            "variant",
            "value",
            "error",
            "addend_stored",
            "accumulator_ulp_at_target",
        ]
    ].copy()
    for c in ("value", "addend_stored"):
        show[c] = show[c].map(_exact)
    show["error"] = show["error"].map(lambda e: f"{e:+.3g}")
    show["accumulator_ulp_at_target"] = show["accumulator_ulp_at_target"].map(lambda u: f"{u:.3g}")
    s["table"] = md_table(
        show.rename(
            columns={
                "addend_stored": "0.01 as stored",
                "accumulator_ulp_at_target": "accumulator spacing at 10",
            }
        )
    )
    sentences = []

    def row(name):
        return a.loc[name] if name in a.index else None

    f32, f16, mix, mix_x = (
        row("fp32 += fp32"),
        row("fp16 += fp16"),
        row("fp32 += fp16"),
        row("fp32 += fp16.to(fp32)"),
    )
    if f32 is not None:
        sentences.append(
            f"fp32 throughout ends at {_exact(f32.value)} (error {f32.error:+.2g}): 0.01 is not a "
            "binary fraction, and each of the 1000 additions rounds to fp32's 24 significant bits; "
            "the rounding errors are tiny and partly cancel."
        )
    if f16 is not None:
        sentences.append(
            f"fp16 throughout ends at {_exact(f16.value)} (error {f16.error:+.3g}): near 10, fp16 "
            f"numbers are {f16.accumulator_ulp_at_target:g} apart, so every addition of 0.01 "
            "(itself stored as "
            f"{_exact(f16.addend_stored)}) is rounded to a multiple of that spacing; the "
            "rounding errors are comparable to the addend and accumulate."
        )
    if mix is not None and mix_x is not None:
        same = "the same value" if mix.value == mix_x.value else "different values"
        sentences.append(
            f"An fp32 accumulator with fp16 addends gives {_exact(mix.value)} implicitly and "
            f"{_exact(mix_x.value)} with an explicit cast ({same}: `+=` promotes the fp16 "
            f"tensor to fp32 either way). The error, {mix.error:+.3g}, is 1000 × the error of "
            f"storing 0.01 in fp16 ({mix.addend_stored - 0.01:+.3g}): the sum itself is exact "
            "enough, the addend is not."
        )
    b16, mixb = row("bf16 += bf16"), row("fp32 += bf16")
    if b16 is not None:
        sentences.append(
            f"bf16 throughout stalls at {_exact(b16.value)}: bf16 keeps only 8 significant bits, "
            f"and from there on the spacing ({b16.accumulator_ulp_at_value:g}) is more than twice "
            "the addend, so every addition rounds back to the same number."
        )
    if mixb is not None:
        sentences.append(
            f"An fp32 accumulator with bf16 addends gives {_exact(mixb.value)}: again the "
            f"stored addend ({_exact(mixb.addend_stored)}) times 1000. Accumulate in fp32."
        )
    s["sentences"] = sentences
    devices = sorted(acc["device"].unique())
    if len(devices) > 1:
        piv = acc.pivot_table(index="variant", columns="device", values="value", aggfunc="first")
        s["devices_agree"] = bool((piv.nunique(axis=1) == 1).all())
    return s


def _dtypes(dts: pd.DataFrame) -> dict:
    s: dict = {}
    good = ok(dts)
    skipped = dts[dts["status"] != "ok"] if "status" in dts else pd.DataFrame()
    if len(good):
        t = good.pivot_table(
            index="tensor", columns=["device", "autocast"], values="dtype", aggfunc="first"
        )
        t = t.reindex([x for x in TENSOR_ORDER if x in t.index])
        t.columns = [f"{d} {a} autocast" for d, a in t.columns]
        s["table"] = md_table(t.reset_index())
        lines = []
        for (device, ac), g in good.groupby(["device", "autocast"]):
            m = g.set_index("tensor")["dtype"]
            lines.append(
                f"{device}, {ac} autocast: parameters stay {m.get('fc1.weight')}; fc1's output is "
                f"{m.get('fc1 output')} (the matmul runs in low precision); LayerNorm's output is "
                f"{m.get('LayerNorm output')}; the logits are {m.get('logits (fc2 output)')}; the "
                f"loss is {m.get('loss')}; gradients are {m.get('fc1.weight.grad')} (like the "
                "parameters they belong to)."
            )
        s["sentences"] = lines
        ln = good[good["tensor"] == "LayerNorm output"].set_index(["device", "autocast"])["dtype"]
        if ("cuda", "fp16") in ln.index:
            s["ln_cuda"] = ln[("cuda", "fp16")]
        if ("cpu", "fp16") in ln.index:
            s["ln_cpu"] = ln[("cpu", "fp16")]
    if len(skipped):
        s["skipped"] = [
            " ".join(str(x) for x in (r.device, getattr(r, "autocast", "")) if pd.notna(x) and x)
            + f": {r.status}"
            for r in skipped.itertuples()
        ]
    return s


def _layernorm(ln: pd.DataFrame) -> dict:
    s: dict = {}
    good = ok(ln)
    if good.empty:
        return s
    dev = "cuda" if (good["device"] == "cuda").any() else "cpu"
    d = good[good["device"] == dev].copy()
    d["case"] = [f"{o:g} + {sp:g}·N(0,1)" for o, sp in zip(d["offset"], d["spread"], strict=True)]
    d["cell"] = [
        "inf/nan" if nf == 1 else (f"{e:.2g}" + (f" ({100 * nf:.0f}% inf/nan)" if nf > 0 else ""))
        for e, nf in zip(d["max_error"], d["nonfinite_fraction"], strict=True)
    ]
    t = d.pivot_table(
        index=["case", "dtype"], columns="quantity", values="cell", aggfunc="first", sort=False
    )
    t = t[[q for q in QUANTITY_LABEL if q in t.columns]].rename(columns=QUANTITY_LABEL)
    s["table"] = md_table(t.reset_index())
    s["device"] = dev

    def get(dtype, off, spread, q):
        r = d[
            (d["dtype"] == dtype)
            & (d["offset"] == off)
            & (d["spread"] == spread)
            & (d["quantity"] == q)
        ]
        return r.iloc[0] if len(r) else None

    lines = []
    v16 = get("fp16", 0.0, 300.0, "variance")
    o16 = get("fp16", 0.0, 300.0, "output")
    vb = get("bf16", 0.0, 300.0, "variance")
    if v16 is not None and v16.nonfinite_fraction > 0:
        lines.append(
            "The variance (a mean of squares) overflows in fp16 for inputs of spread 300: "
            "300² = 90,000 exceeds fp16's largest value, 65,504; the output then collapses "
            f"silently to 0 (x·rsqrt(inf)), an error of {o16.max_error:.2g}, with no inf in "
            "sight."
            + (
                f" bf16 has fp32's exponent range and does not overflow (variance error {vb.max_error:.2g})."
                if vb is not None and vb.nonfinite_fraction == 0
                else ""
            )
        )
    n32 = get("fp32", 1000.0, 1.0, "variance_naive")
    c32 = get("fp32", 1000.0, 1.0, "variance")
    if n32 is not None and c32 is not None:
        lines.append(
            f"Computing the variance as E[x²]−E[x]² cancels catastrophically when the mean is "
            f"large against the spread: error {n32.max_error:.2g} (relative) even in fp32 for "
            f"x ≈ 1000 ± 1, against {c32.max_error:.2g} for the centered two-pass form."
        )
    ob = get("bf16", 1000.0, 1.0, "output")
    o16b = get("fp16", 1000.0, 1.0, "output")
    mb = get("bf16", 0.0, 1.0, "output")
    if ob is not None:
        lines.append(
            f"With a mean of 1000 and a spread of 1, bf16 cannot even hold the input: its "
            f"spacing near 1000 is 4, so the centered values are mostly rounding noise and the "
            f"normalized output is off by up to {ob.max_error:.2g}"
            + (f" (fp16: {o16b.max_error:.2g})" if o16b is not None else "")
            + (
                f"; for well-centred inputs the bf16 output error is {mb.max_error:.2g}."
                if mb is not None
                else "."
            )
        )
    lines.append(
        "So the reductions (mean and above all the variance, a sum of squares) and the "
        "subtraction of the mean are the sensitive parts: fp16 fails by overflow, bf16 by "
        "precision. bf16 removes the overflow but not the loss of precision, which is why "
        "autocast runs layer norm in fp32 on CUDA and why our RMSNorm upcasts to fp32."
    )
    s["sentences"] = lines
    return s


def _speed_and_memory(results_dir: Path) -> dict:
    s: dict = {}
    bench = load(results_dir, "benchmark")
    if len(bench):
        b = ok(bench)
        b = b[(b.get("compile", "eager") == "eager") & (b.get("attention", "naive") == "naive")]
        if "engine" in b:  # the plain model's rows (the engine's are the benchmark's own table)
            b = b[b["engine"].fillna("plain") == "plain"]
        keys = ["size", "context_length", "mode"]
        a = b[b["precision"] == "fp32"].set_index(keys)["step_ms_mean"]
        c = b[b["precision"] == "bf16"].set_index(keys)["step_ms_mean"]
        sp = pd.concat({"fp32": a, "bf16": c}, axis=1).dropna()
        if len(sp):
            sp["speedup"] = sp["fp32"] / sp["bf16"]
            t = sp.reset_index().pivot_table(
                index="size", columns="mode", values="speedup", aggfunc="median"
            )
            t = t.reindex([x for x in SIZE_ORDER if x in t.index])
            t.columns.name = None
            t = t.rename(columns=MODE_LABEL)
            s["speed_table"] = md_table(t.reset_index())
            s["speed_sentence"] = (
                f"bf16 autocast over fp32 (eager, naive attention, each point against itself: "
                f"the pairs of the benchmark section's Q3): median speedup "
                f"{sp['speedup'].median():.2f}× over {len(sp)} points (range "
                f"{sp['speedup'].min():.2f}–{sp['speedup'].max():.2f}×)."
            )
    mem = load(results_dir, "memory")
    if len(mem):
        m = ok(mem)
        if "checkpoint" in m:  # the checkpointed points of the 2026 grid compare in Memory
            m = m[m["checkpoint"].fillna("none") == "none"]
        cuda = "peak_allocated_mb" in m and m["peak_allocated_mb"].notna().any()
        # a CPU's RSS growth is too coarse for a ratio: compare the activations saved instead
        col = "peak_allocated_mb" if cuda else "saved_activations_mb"
        keys = ["size", "context_length", "mode"]
        a = m[m["precision"] == "fp32"].set_index(keys)[col]
        c = m[m["precision"] == "bf16"].set_index(keys)[col]
        r = pd.concat({"fp32": a, "bf16": c}, axis=1).dropna()
        if len(r):
            ratio = (r["bf16"] / r["fp32"]).replace([np.inf, -np.inf], np.nan).dropna()
            what = (
                "peak allocated memory"
                if cuda
                else "activation memory saved for backward (no allocator statistics on a CPU)"
            )
            s["memory_sentence"] = (
                f"bf16 autocast {what} is {ratio.median():.2f}× the fp32 value ("
                + (f"median over {len(ratio)} points" if len(ratio) > 1 else "one point")
                + "; see the Memory section)."
            )
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
