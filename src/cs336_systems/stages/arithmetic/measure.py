"""Stage `arithmetic`: the communication arithmetic of the 2026 handout (section 8), evaluated.

Every formula is a function of core/costs.py (its docstring holds the derivation); this module
only chooses the numbers it is evaluated with and writes one row per answer:
(problem, case, shape, devices, quantity, value, unit, formula, status).

Cases:
- `b200`: the handout's B200, C = 2500 TFLOP/s (FP16/BF16, handout section 2.1.5) and an
  egress bandwidth W given in the config (the handout gives none; NVLink 5 carries 1.8 TB/s
  per GPU, 900 GB/s each way);
- `measured-<backend>`: this machine, C the plain 16-bit matmul peak of the ceilings stage's
  CSV (the first of `--dtypes` measured), W the best bus bandwidth of `<backend>` in the
  allreduce stage's CSV (under the ring model a rank's link carries busbw = 2 (N-1)/N S / t,
  which is the handout's W). A number the inputs lack makes that case's rows `skipped: <why>`.

`ring_check` rows put the ring all-reduce time 2 (N-1)/N S / W (W the best bus bandwidth)
beside each all-reduce the allreduce stage measured: measured / predicted per size. An
all-reduce that failed a sanity check (core/sanity.py) gives neither W nor a row.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

from cs336_systems.core import costs, sanity
from cs336_systems.core.edition import add_edition_argument
from cs336_systems.core.log import configure, get_logger, point
from cs336_systems.core.results import provenance, write_csv

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
    """(C in FLOP/s, where from, why not): the plain-matmul peak of the first of `dtypes` the
    ceilings CSV has an ok row for."""
    if df is None:
        return math.nan, "", f"no matmul peak: {why}"
    mm = df[(df["kind"] == "matmul") & (df["status"] == "ok")]
    if "path" in mm:
        mm = mm[mm["path"].fillna("matmul") == "matmul"]
    for dtype in dtypes:
        rows = mm[mm["dtype"] == dtype]
        if len(rows):
            tflops = float(rows["tflops"].max())
            return tflops * 1e12, f"ceilings: {dtype} matmul {tflops:.4g} TFLOP/s", ""
    return math.nan, "", f"no ok {'/'.join(dtypes)} matmul row in ceilings.csv"


def best_busbw(df: pd.DataFrame | None, why: str, backend: str) -> tuple[float, str, str]:
    """(W in bytes/s, where from, why not): the best bus bandwidth `backend` reached."""
    if df is None:
        return math.nan, "", f"no bus bandwidth: {why}"
    rows = df[(df["backend"] == backend) & (df["status"] == "ok")]
    if not len(rows):
        return math.nan, "", f"no ok {backend} row in allreduce.csv"
    r = rows.loc[rows["busbw_gbps"].idxmax()]
    src = (
        f"allreduce: {backend} busbw {r['busbw_gbps']:.4g} GB/s "
        f"({int(r['world_size'])} ranks, {r['size_mb']:g} MB)"
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
    for _, r in df[(df["backend"] == backend) & (df["status"] == "ok")].iterrows():
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
                "source": source,
                "status": "ok",
            }
        )
    return rows


def parse_shapes(text: str) -> list[dict]:
    out = []
    for item in text.split(","):
        name, tokens, d, dff = item.split(":")
        out.append({"name": name, "tokens": int(tokens), "d_model": int(d), "d_ff": int(dff)})
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shapes", required=True, help="name:tokens:d_model:d_ff,...")
    ap.add_argument("--devices", default="2,8")
    ap.add_argument("--splits", default="8x8", help="N_FSDPxN_TP,...")
    ap.add_argument("--message-mb", type=float, default=1024)
    ap.add_argument("--b200-tflops", type=float, default=2500)
    ap.add_argument("--b200-egress-gbps", type=float, default=900)
    ap.add_argument("--dtypes", default="fp16,bf16")
    ap.add_argument("--backends", default="nccl,gloo")
    ap.add_argument("--ceilings", default="")
    ap.add_argument("--allreduce", default="")
    ap.add_argument("--machine", required=True)
    ap.add_argument("--preset", required=True)
    ap.add_argument("--out", required=True)
    add_edition_argument(ap)
    args = ap.parse_args(argv)
    configure("arithmetic")
    shapes = parse_shapes(args.shapes)
    devices = [int(x) for x in args.devices.split(",")]
    splits = [tuple(int(v) for v in s.split("x")) for s in args.splits.split(",")]
    ceilings, why_c = _read(args.ceilings, "ceilings")
    allreduce, why_w = _read(args.allreduce, "allreduce")
    if allreduce is not None:  # a point that failed a sanity check gives neither W nor a ring row
        allreduce = allreduce[~sanity.is_suspect(sanity.flag(allreduce, "allreduce"))]
    b200 = (
        f"handout: C = {args.b200_tflops:g} TFLOP/s (FP16); "
        f"config: W = {args.b200_egress_gbps:g} GB/s (NVLink 5 per direction, not in the handout)"
    )
    cases = [("b200", args.b200_tflops * 1e12, args.b200_egress_gbps * 1e9, b200, "")]
    c, c_src, c_why = matmul_peak(ceilings, why_c, args.dtypes.split(","))
    checks = []
    for backend in args.backends.split(","):
        w, w_src, w_why = best_busbw(allreduce, why_w, backend)
        source = "; ".join(s for s in (c_src, w_src) if s)
        cases.append(
            (f"measured-{backend}", c, w, source, "; ".join(x for x in (c_why, w_why) if x))
        )
        checks += ring_check(allreduce, w_why, backend, w, w_src)
    rows = []
    for case, cc, ww, source, why in cases:
        with point(case):
            got = case_rows(case, shapes, devices, splits, args.message_mb, cc, ww, source, why)
            bad = [r for r in got if r["status"] != "ok"]
            if bad:
                log.warning("%d rows skipped: %s", len(bad), bad[0]["status"])
            log.info(
                "%d answers (C %.4g TFLOP/s, W %.4g GB/s)", len(got) - len(bad), cc / 1e12, ww / 1e9
            )
            rows += got
    rows += checks
    base = provenance(args.machine, args.preset, args.edition)
    write_csv([{**base, **r} for r in rows], args.out)
    log.info("wrote %s: %d rows", args.out, len(rows))


if __name__ == "__main__":
    main()
