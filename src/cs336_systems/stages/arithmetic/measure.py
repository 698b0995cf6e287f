"""Stage `arithmetic`: the communication arithmetic of the 2026 handout (section 8) and the
communication accounting of the 2025 handout (section 2.4), evaluated.

Every formula is a function of core/costs.py (its docstring holds the derivation); this module
only chooses the numbers it is evaluated with and writes one row per answer:
(problem, case, shape, devices, quantity, value, unit, formula, status).

Cases:
- `b200`: the handout's B200, C = 2500 TFLOP/s (FP16/BF16, handout section 2.1.5) and an
  egress bandwidth W given in the config (the handout gives none; NVLink 5 carries 1.8 TB/s
  per GPU, 900 GB/s each way);
- `measured-<backend>`: this machine, C the fastest 16-bit matmul of the ceilings stage's CSV
  (the `measured.dtypes` knob, any path; a faster fp32 where the machine has no faster 16-bit path), W the best
  bus bandwidth of `<backend>` in the allreduce stage's CSV (under the ring model a rank's link
  carries busbw = 2 (N-1)/N S / t, which is the handout's W). A number the inputs lack makes that case's rows `skipped: <why>`.

`communication_accounting` rows (case `tpu-v5p`): the 2025 handout's XXL model on its TPU v5p
numbers (core/costs.py xxl_accounting), for the handout's mesh and, for part (d), the variants
that shrink the compute-bound batch: tensor parallelism up to its bound at the same device count,
8-bit weight all-gathers, and both.

`residual_activation` rows (memory_profiling (d)): the bytes of one fp32 residual-stream
activation (B, T, d_model) of the model the edition's handout names, derived: no GPU needed.

`ring_check` rows put the ring all-reduce time 2 (N-1)/N S / W (W the best bus bandwidth)
beside each all-reduce the allreduce stage measured: measured / predicted per size. An
all-reduce its aggregate flagged suspect (reporting/sanity.py) gives neither W nor a row.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path

import pandas as pd

from cs336_systems.core import costs
from cs336_systems.core.results import is_suspect, provenance, write_csv
from cs336_systems.planning.edition import size_table
from cs336_systems.planning.knobs import add_block_argument, add_run_arguments
from cs336_systems.planning.log import configure, get_logger, point
from cs336_systems.stages.arithmetic.plan import Activation, ArithmeticKnobs, Tpu, Xxl

log = get_logger(__name__)

PROBLEMS = (
    "alternate_ring_all_reduce",
    "data_parallel_calcs",
    "fsdp_calcs",
    "tp_calcs",
    "fsdp_tp_calcs",
)
MB = 2**20


def _read(path: str | None, stage: str) -> tuple[pd.DataFrame | None, str]:
    """The CSV of `stage`, or None and why not."""
    if not path:
        return None, f"stage {stage} is not in this run"
    if not Path(path).exists():
        return None, f"{path} does not exist"
    df = pd.read_csv(path)
    if "status" not in df:
        return None, f"{path} has no status column"
    return df, ""


def matmul_peak(df: pd.DataFrame | None, why: str, dtypes: list[str]) -> tuple[float, str, str]:
    """(C in FLOP/s, where from, why not): the fastest matmul the ceilings CSV measured among
    `dtypes` (the 16-bit ones the handout's C counts), over every path (plain, autocast
    F.linear); where a wider dtype measured faster still (a CPU without 16-bit units), that
    one, said so: C is how fast this machine multiplies, whatever the operands."""
    if df is None:
        return math.nan, "", f"no matmul peak: {why}"
    mm = df[(df["kind"] == "matmul") & (df["status"] == "ok")].copy()
    mm["path"] = mm["path"].fillna("matmul") if "path" in mm else "matmul"
    mm = mm[mm["tflops"].notna()]
    narrow = mm[mm["dtype"].isin(dtypes)]
    if not len(narrow):
        return math.nan, "", f"no ok {'/'.join(dtypes)} matmul row in ceilings.csv"

    def said(r: pd.Series) -> str:
        how = "" if r["path"] == "matmul" else f" ({PATHS.get(r['path'], r['path'])})"
        return f"{r['dtype']} matmul{how} {r['tflops']:.4g} TFLOP/s"

    best = narrow.loc[narrow["tflops"].idxmax()]
    wide = mm.loc[mm["tflops"].idxmax()]
    if wide["tflops"] > best["tflops"]:
        return (
            float(wide["tflops"]) * 1e12,
            f"ceilings: {said(wide)}, faster than its fastest 16-bit path ({said(best)})",
            "",
        )
    return float(best["tflops"]) * 1e12, f"ceilings: {said(best)}", ""


# how a ceilings path is named in a case's source
PATHS = {"autocast_linear": "autocast F.linear"}


def best_row(df: pd.DataFrame, backend: str) -> pd.Series | None:
    """The all-reduce row whose bus bandwidth is `backend`'s best (where W comes from)."""
    rows = df[(df["backend"] == backend) & (df["status"] == "ok")]
    return rows.loc[rows["busbw_gbps"].idxmax()] if len(rows) else None


def best_busbw(df: pd.DataFrame | None, why: str, backend: str) -> tuple[float, str, str]:
    """(W in bytes/s, where from, why not): the best bus bandwidth `backend` reached."""
    if df is None:
        return math.nan, "", f"no bus bandwidth: {why}"
    r = best_row(df, backend)
    if r is None:
        return math.nan, "", f"no ok {backend} row in allreduce.csv"
    src = (
        f"allreduce: {backend} busbw {r['busbw_gbps']:.4g} GB/s "
        f"({int(r['world_size'])} ranks, {r['size_mb']:g} MiB)"
    )
    return float(r["busbw_gbps"]) * 1e9, src, ""


def answers(shape: dict, devices: list[int], splits, message_mb: float, c: float, w: float):
    """(problem, devices, n_fsdp, n_tp, shape-dependent?, {quantity: Quantity}) of every
    problem at these numbers."""
    b, d, dff = shape["tokens"], shape["d_model"], shape["d_ff"]
    for n in devices:
        yield (
            "alternate_ring_all_reduce",
            n,
            None,
            None,
            costs.alternate_ring_all_reduce(message_mb * MB, n, w),
        )
        yield "data_parallel_calcs", n, None, None, costs.data_parallel(b, d, dff, n, c, w)
        yield "fsdp_calcs", n, None, None, costs.fsdp(b, d, dff, n, c, w)
        yield "tp_calcs", n, None, None, costs.tensor_parallel(b, d, dff, n, c, w)
    for nf, nt in splits:
        yield "fsdp_tp_calcs", nf * nt, nf, nt, costs.fsdp_tp(b, d, dff, nf, nt, c, w)


def case_rows(case: str, shapes, devices, splits, message_mb, c, w, source, why) -> list[dict]:
    """Every answer of one case; where a number is missing (NaN), one `skipped: <why>` row per
    problem and shape instead (the alternate ring all-reduce needs W only)."""
    rows = []
    for shape in shapes:
        base = {
            "case": case,
            "shape": shape["name"],
            "tokens": shape["tokens"],
            "d_model": shape["d_model"],
            "d_ff": shape["d_ff"],
            "C_tflops": c / 1e12,
            "W_gbps": w / 1e9,
            "source": source,
        }
        skipped = set()
        for problem, n, nf, nt, qs in answers(shape, devices, splits, message_mb, c, w):
            if math.isnan(w) or (problem != PROBLEMS[0] and math.isnan(c)):
                if problem not in skipped:
                    skipped.add(problem)
                    rows.append({**base, "problem": problem, "status": f"skipped: {why}"})
                continue
            for quantity, q in qs.items():
                rows.append(
                    {
                        **base,
                        "problem": problem,
                        "devices": n,
                        "n_fsdp": nf,
                        "n_tp": nt,
                        "message_mb": message_mb if problem == PROBLEMS[0] else None,
                        "quantity": quantity,
                        "value": q.value,
                        "unit": q.unit,
                        "formula": q.formula,
                        "status": "ok",
                    }
                )
    return rows


def ring_check(df: pd.DataFrame | None, why: str, backend: str, w: float, source: str):
    """Measured all-reduce times of `backend` against 2 (N-1)/N S / W; `why`: why there is no
    W (a `skipped` row then)."""
    if df is None or math.isnan(w):
        return [
            {"problem": "ring_check", "case": f"measured-{backend}", "status": f"skipped: {why}"}
        ]
    rows = []
    source_row = best_row(df, backend).name
    for i, r in df[(df["backend"] == backend) & (df["status"] == "ok")].iterrows():
        n, s = int(r["world_size"]), float(r["bytes"])
        predicted = costs.ring_all_reduce_time(s, n, w)
        measured = float(r["time_ms_median"]) * 1e-3
        rows.append(
            {
                "problem": "ring_check",
                "case": f"measured-{backend}",
                "devices": n,
                "buffers": r.get("buffers", "default"),
                "message_mb": float(r["size_mb"]),
                "quantity": "measured_over_predicted",
                "value": measured / predicted,
                "unit": "x",
                "formula": "t_measured / (2 (N-1)/N S / W)",
                "predicted_ms": predicted * 1e3,
                "measured_ms": measured * 1e3,
                "W_gbps": w / 1e9,
                # W is this row's bus bandwidth: here the model equals the measurement by
                # construction, so this row checks nothing
                "w_measured_here": i == source_row,
                "source": source,
                "status": "ok",
            }
        )
    return rows


def accounting_variants(x: int, y: int, max_tp: float) -> list[tuple[str, int, int, int]]:
    """(variant, X, Y, weight bytes): the handout's mesh; the same N = X Y with Y the largest
    power of two within the TP bound; 8-bit weight all-gathers; both."""
    n, y_max = x * y, y
    while y_max * 2 <= min(max_tp, n) and n % (y_max * 2) == 0:
        y_max *= 2
    out = [("handout", x, y, 2)]
    if y_max != y:
        out.append(("more TP", n // y_max, y_max, 2))
    out.append(("8-bit all-gathers", x, y, 1))
    if y_max != y:
        out.append(("more TP and 8-bit all-gathers", n // y_max, y_max, 1))
    return out


def accounting_rows(xxl: Xxl, tpu: Tpu, h100_gb: float) -> list[dict]:
    """Every answer of communication_accounting, one row per quantity and variant."""
    d, dff, blocks = xxl.d_model, xxl.d_ff, xxl.blocks
    tflops, ici, hbm = tpu.tflops, tpu.ici_gbps, tpu.hbm_gb
    (x, y), (m_x, m_y) = tpu.mesh, tpu.axes
    c, w, m = float(tflops) * 1e12, float(ici) * 1e9, float(hbm) * 1e9

    def evaluate(xx, yy, wb):
        return costs.xxl_accounting(d, dff, blocks, m, h100_gb * 1e9, c, w, xx, yy, m_x, m_y, wb)

    max_tp = evaluate(x, y, 2)["max_tp"].value
    base = {
        "problem": "communication_accounting",
        "case": "tpu-v5p",
        "d_model": d,
        "d_ff": dff,
        "blocks": blocks,
        "C_tflops": c / 1e12,
        "W_gbps": w / 1e9,
        "hbm_gb": m / 1e9,
        "m_x": m_x,
        "m_y": m_y,
        "source": f"handout: C = {float(tflops):g} TFLOP/s, W_ici = {float(ici):g} GB/s, "
        f"{float(hbm):g} GB a TPU v5p, {x} x {y} mesh, M_X = {m_x}, M_Y = {m_y}",
        "status": "ok",
    }
    rows = []
    for variant, xx, yy, wb in accounting_variants(x, y, max_tp):
        for quantity, q in evaluate(xx, yy, wb).items():
            rows.append(
                {
                    **base,
                    "variant": variant,
                    "devices": xx * yy,
                    "n_fsdp": xx,
                    "n_tp": yy,
                    "weight_bytes": wb,
                    "quantity": quantity,
                    "value": q.value,
                    "unit": q.unit,
                    "formula": q.formula,
                }
            )
    return rows


def activation_rows(a: Activation, edition: int) -> list[dict]:
    """memory_profiling (d): the bytes of one fp32 residual-stream activation, (B, T, d_model),
    of the edition's model at each context length; in MiB (2^20 bytes), as the handout asks."""
    d_model = int(size_table(edition)[a.size]["d_model"])
    return [
        {
            "problem": "residual_activation",
            "case": "model",
            "size": a.size,
            "d_model": d_model,
            "batch_size": a.batch_size,
            "context_length": t,
            "quantity": "activation_mib",
            "value": a.batch_size * t * d_model * 4 / MB,
            "unit": "MiB",
            "formula": "B T d_model x 4 bytes / 2^20",
            "source": f"the {edition} handout's {a.size} (d_model = {d_model}), batch {a.batch_size}",
            "status": "ok",
        }
        for t in a.context_lengths
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The run's own arguments (its input CSVs, where its rows go and what they say they come
    from) and the stage's knobs as one value (`--block`: its preset block, `ArithmeticKnobs`)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_arguments(ap)
    add_block_argument(ap, ArithmeticKnobs)
    ap.add_argument("--ceilings", help="the ceilings stage's CSV (C), where it ran")
    ap.add_argument("--allreduce", help="the allreduce stage's CSV (W), where it ran")
    args = ap.parse_args(argv)
    if args.out is None:
        ap.error("--out is required")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    k: ArithmeticKnobs = args.block
    configure("arithmetic")
    shapes = [dataclasses.asdict(shape) for shape in k.shapes]
    devices, splits, message_mb = list(k.devices), [tuple(s) for s in k.splits], float(k.message_mb)
    b200_tflops, b200_egress_gbps = float(k.b200.tflops), float(k.b200.egress_gbps)
    ceilings, why_c = _read(args.ceilings, "ceilings")
    allreduce, why_w = _read(args.allreduce, "allreduce")
    if (
        allreduce is not None
    ):  # a point its aggregate flagged suspect gives neither W nor a ring row
        allreduce = allreduce[~is_suspect(allreduce)]
    b200 = (
        f"handout: C = {b200_tflops:g} TFLOP/s (FP16); "
        f"config: W = {b200_egress_gbps:g} GB/s (NVLink 5 per direction, not in the handout)"
    )
    cases = [("b200", b200_tflops * 1e12, b200_egress_gbps * 1e9, b200, "")]
    c, c_src, c_why = matmul_peak(ceilings, why_c, list(k.measured.dtypes))
    checks = []
    for backend in k.measured.backends:
        w, w_src, w_why = best_busbw(allreduce, why_w, backend)
        source = "; ".join(s for s in (c_src, w_src) if s)
        cases.append(
            (f"measured-{backend}", c, w, source, "; ".join(x for x in (c_why, w_why) if x))
        )
        checks += ring_check(allreduce, w_why, backend, w, w_src)
    rows = []
    for case, cc, ww, source, why in cases:
        with point(case):
            got = case_rows(case, shapes, devices, splits, message_mb, cc, ww, source, why)
            bad = [r for r in got if r["status"] != "ok"]
            if bad:
                log.warning("%d rows skipped: %s", len(bad), bad[0]["status"])
            log.info(
                "%d answers (C %.4g TFLOP/s, W %.4g GB/s)", len(got) - len(bad), cc / 1e12, ww / 1e9
            )
            rows += got
    rows += checks
    with point("communication_accounting"):
        acc = accounting_rows(k.xxl, k.tpu, float(k.h100_gb))
        log.info("%d answers of the XXL model's accounting", len(acc))
    rows += acc
    rows += activation_rows(k.activation, args.edition)
    base = provenance(args.machine, args.preset, args.edition)
    write_csv([{**base, **r} for r in rows], args.out)
    log.info("wrote %s: %d rows", args.out, len(rows))


if __name__ == "__main__":
    main()
