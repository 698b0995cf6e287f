"""The `precision` section's answers in words: why each accumulation ends where it does (Q10),
the dtype autocast gives each tensor (Q11), where LayerNorm loses accuracy in low precision
(Q12), and what bf16 autocast does to speed and memory (benchmark and memory stages)."""

from __future__ import annotations

import pandas as pd

from cs336_systems.reporting.analysis import MEMORY_MODE_LABEL
from cs336_systems.stages.precision.rows import exact


def accumulation_sentences(a: pd.DataFrame) -> list[str]:
    """One device's accumulations (`a`, by variant): why each ends where it does."""
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
            f"fp32 throughout ends at {exact(f32.value)} (error {f32.error:+.2g}): 0.01 is not a "
            "binary fraction, and each of the 1000 additions rounds to fp32's 24 significant bits; "
            "the rounding errors are tiny and partly cancel."
        )
    if f16 is not None:
        sentences.append(
            f"fp16 throughout ends at {exact(f16.value)} (error {f16.error:+.3g}): near 10, fp16 "
            f"numbers are {f16.accumulator_ulp_at_target:g} apart, so every addition of 0.01 "
            "(itself stored as "
            f"{exact(f16.addend_stored)}) is rounded to a multiple of that spacing; the "
            "rounding errors are comparable to the addend and accumulate."
        )
    if mix is not None and mix_x is not None:
        same = "the same value" if mix.value == mix_x.value else "different values"
        sentences.append(
            f"An fp32 accumulator with fp16 addends gives {exact(mix.value)} implicitly and "
            f"{exact(mix_x.value)} with an explicit cast ({same}: `+=` promotes the fp16 "
            f"tensor to fp32 either way). The error, {mix.error:+.3g}, is 1000 × the error of "
            f"storing 0.01 in fp16 ({mix.addend_stored - 0.01:+.3g}): the sum itself is exact "
            "enough, the addend is not."
        )
    b16, mixb = row("bf16 += bf16"), row("fp32 += bf16")
    if b16 is not None:
        sentences.append(
            f"bf16 throughout stalls at {exact(b16.value)}: bf16 keeps only 8 significant bits, "
            f"and from there on the spacing ({b16.accumulator_ulp_at_value:g}) is more than twice "
            "the addend, so every addition rounds back to the same number."
        )
    if mixb is not None:
        sentences.append(
            f"An fp32 accumulator with bf16 addends gives {exact(mixb.value)}: again the "
            f"stored addend ({exact(mixb.addend_stored)}) times 1000. Accumulate in fp32."
        )
    return sentences


def dtype_sentences(good: pd.DataFrame) -> list[str]:
    """Per device and autocast dtype: the dtype of the parameters, the activations, the loss
    and the gradients."""
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
    return lines


def skipped_lines(skipped: pd.DataFrame) -> list[str]:
    """The dtype runs that did not run, with why."""
    return [
        " ".join(str(x) for x in (r.device, getattr(r, "autocast", "")) if pd.notna(x) and x)
        + f": {r.status}"
        for r in skipped.itertuples()
    ]


def layernorm_sentences(d: pd.DataFrame) -> list[str]:
    """Where LayerNorm fails in fp16 and bf16 (`d`: one device's rows, rows.py
    `layernorm_rows`), and which of its parts are the sensitive ones."""

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
    return lines


def speed_sentence(sp: pd.DataFrame) -> str:
    """bf16 autocast's speed-up over fp32 (rows.py `speedups`), the host-bound pairs (the one
    rule, reporting/host_bound.py) named and left out of the median."""
    hb = sp["host_bound"] if "host_bound" in sp else pd.Series(False, index=sp.index)
    kept = sp[~hb.astype(bool)]
    out = (
        "bf16 autocast over fp32 (eager, naive attention, each point against itself: "
        "the pairs of the benchmark section's Q3): median speedup "
    )
    if len(kept):
        out += (
            f"{kept['speedup'].median():.2f}× over {len(kept)} points (range "
            f"{kept['speedup'].min():.2f}–{kept['speedup'].max():.2f}×)"
        )
    else:
        out += "not given (every pair is host-bound)"
    if hb.any():
        names = ", ".join(
            f"`{i[0]}` ctx {i[1]} {i[2]} ({sp.loc[i, 'speedup']:.2f}×)" for i in sp.index[hb]
        )
        out += f"; left out, host-bound by the benchmark's rule: {names}"
    return out + "."


def _ratio_range(r: pd.Series) -> str:
    """One mode's bf16/fp32 ratios (`r`, by size and context): the one point's, or the range
    with the point at each end."""
    lo, hi = r.idxmin(), r.idxmax()
    if len(r) > 1 and f"{r[lo]:.2f}" == f"{r[hi]:.2f}":
        return f"{r[lo]:.2f}× at each of its {len(r)} points"
    at = f"{r[lo]:.2f}× ({lo[0]}, context {lo[1]})"
    return at if len(r) == 1 else f"{at} to {r[hi]:.2f}× ({hi[0]}, context {hi[1]})"


def memory_sentence(ratio: pd.Series, cuda: bool) -> str:
    """bf16 autocast's memory against fp32's (rows.py `memory_ratio`), per mode: an inference
    forward, a forward with autograd on and a training step keep different things, so one
    median over them says none of them."""
    what = (
        "peak allocated memory"
        if cuda
        else "activation memory saved for backward (no allocator statistics on a CPU)"
    )
    order = {m: i for i, m in enumerate(MEMORY_MODE_LABEL)}
    modes = sorted(set(ratio.index.get_level_values("mode")), key=lambda m: (order.get(m, 99), m))
    per_mode = [
        f"{MEMORY_MODE_LABEL.get(m, m)} {_ratio_range(ratio.xs(m, level='mode'))}" for m in modes
    ]
    return (
        f"bf16 autocast's {what} against fp32's, per mode: {'; '.join(per_mode)} (each point "
        "is in the Memory section)."
    )
