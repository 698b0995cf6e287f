"""Stage `precision`: what low-precision floating point does to sums, autocast and LayerNorm.

    python -m cs336_systems.stages.precision run --machine M --preset P \
        --block '{"devices": ["cpu", "cuda"]}' --out accumulation.csv \
        --dtypes-out dtypes.csv --layernorm-out layernorm.csv

Three experiments, on the CPU and (when present) on CUDA:

1. accumulation: 0.01 added 1000 times (the handout's four snippets: fp32; fp16; an fp32
   accumulator with fp16 addends, implicitly and explicitly cast; plus the bf16 variants and an
   fp64 reference), with the exact value reached, its error, the value 0.01 actually has in the
   addend's format and the spacing of the accumulator's format at 10.
2. autocast dtypes of the handout's toy model (fc1 -> ReLU -> LayerNorm -> fc2) under fp16 and
   bf16 autocast: parameters, each layer's output, logits, loss and gradients.
3. LayerNorm sensitivity: each step of LayerNorm (mean, variance, the naive E[x^2]-E[x]^2
   variance, the normalized output) computed in fp16 / bf16 / fp32 on inputs with a large mean
   or a large spread, against an fp64 reference.
"""

from __future__ import annotations

import argparse

import pandas as pd
import torch
from torch import nn

from cs336_systems.core.harness import Stopwatch
from cs336_systems.core.results import provenance, write_csv
from cs336_systems.planning.knobs import add_block_argument, add_run_arguments
from cs336_systems.planning.log import configure, get_logger
from cs336_systems.stages.precision.plan import PrecisionKnobs

log = get_logger(__name__)

DTYPES = {
    "fp64": torch.float64,
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}
ADDEND = 0.01
COUNT = 1000
TARGET = ADDEND * COUNT  # 10

# (name, accumulator, addend, cast): the handout's four snippets, their bf16 twins, a reference
ACCUMULATION_VARIANTS = [
    ("fp32 += fp32", "fp32", "fp32", "none"),
    ("fp16 += fp16", "fp16", "fp16", "none"),
    ("fp32 += fp16", "fp32", "fp16", "implicit"),
    ("fp32 += fp16.to(fp32)", "fp32", "fp16", "explicit"),
    ("bf16 += bf16", "bf16", "bf16", "none"),
    ("fp32 += bf16", "fp32", "bf16", "implicit"),
    ("fp32 += bf16.to(fp32)", "fp32", "bf16", "explicit"),
    ("fp64 += fp64", "fp64", "fp64", "none"),
]


def devices() -> list[str]:
    return ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


def ulp(value: float, dtype: torch.dtype) -> float:
    """Spacing of `dtype`'s representable numbers at `value` (distance to the next one up)."""
    x = torch.tensor(value, dtype=dtype)
    return (torch.nextafter(x, torch.tensor(float("inf"), dtype=dtype)) - x).item()


def accumulate(acc: str, addend: str, cast: str, device: str = "cpu") -> float:
    """Sum ADDEND COUNT times exactly as the handout's snippets do (one tensor add per step)."""
    s = torch.tensor(0, dtype=DTYPES[acc], device=device)
    for _ in range(COUNT):
        x = torch.tensor(ADDEND, dtype=DTYPES[addend], device=device)
        s += x.type(DTYPES[acc]) if cast == "explicit" else x
    return s.item()


def accumulation_rows(device: str) -> list[dict]:
    rows = []
    for name, acc, addend, cast in ACCUMULATION_VARIANTS:
        value = accumulate(acc, addend, cast, device)
        stored = torch.tensor(ADDEND, dtype=DTYPES[addend]).item()
        rows.append(
            {
                "device": device,
                "variant": name,
                "accumulator": acc,
                "addend": addend,
                "cast": cast,
                "value": value,
                "error": value - TARGET,
                "abs_error": abs(value - TARGET),
                "rel_error": abs(value - TARGET) / TARGET,
                "addend_stored": stored,
                "addend_sum_exact": stored * COUNT,
                "accumulator_ulp_at_target": ulp(TARGET, DTYPES[acc]),
                "accumulator_ulp_at_value": ulp(value, DTYPES[acc]),
                "status": "ok",
            }
        )
    return rows


class ToyModel(nn.Module):
    """The handout's toy model."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, 10, bias=False)
        self.ln = nn.LayerNorm(10)
        self.fc2 = nn.Linear(10, out_features, bias=False)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.fc1(x))
        x = self.ln(x)
        x = self.fc2(x)
        return x


def autocast_dtypes(device: str, dtype: str) -> list[dict]:
    """The dtype of every tensor of one toy-model training step under `dtype` autocast."""
    torch.manual_seed(0)
    model = ToyModel(16, 5).to(device)
    x = torch.randn(8, 16, device=device)
    y = torch.randint(0, 5, (8,), device=device)
    seen: list[tuple[str, str, torch.dtype]] = []
    hooks = [
        model.fc1.register_forward_hook(
            lambda m, a, o: seen.append(("fc1 output", "activation", o.dtype))
        ),
        model.relu.register_forward_hook(
            lambda m, a, o: seen.append(("ReLU output", "activation", o.dtype))
        ),
        model.ln.register_forward_hook(
            lambda m, a, o: seen.append(("LayerNorm output", "activation", o.dtype))
        ),
    ]
    try:
        with torch.autocast(device_type=device, dtype=DTYPES[dtype]):
            for name, p in model.named_parameters():
                seen.append((f"{name}", "parameter", p.dtype))
            logits = model(x)
            seen.append(("logits (fc2 output)", "activation", logits.dtype))
            loss = nn.functional.cross_entropy(logits, y)
            seen.append(("loss", "loss", loss.dtype))
        loss.backward()
        for name, p in model.named_parameters():
            seen.append((f"{name}.grad", "gradient", p.grad.dtype))
    finally:
        for h in hooks:
            h.remove()
    return [
        {
            "device": device,
            "autocast": dtype,
            "tensor": t,
            "kind": k,
            "dtype": str(d).removeprefix("torch."),
            "status": "ok",
        }
        for t, k, d in seen
    ]


def dtype_rows(device: str) -> list[dict]:
    rows = []
    for dtype in ("fp16", "bf16"):
        try:
            rows += autocast_dtypes(device, dtype)
        except (RuntimeError, TypeError) as exc:  # autocast may not support a dtype on a device
            reason = str(exc).strip().splitlines()[0][:120].replace(",", ";")
            rows.append({"device": device, "autocast": dtype, "status": f"skipped: {reason}"})
    return rows


LN_FEATURES = 1024
LN_ROWS = 64
LN_CASES = [(0.0, 1.0), (100.0, 1.0), (1000.0, 1.0), (0.0, 300.0)]  # (mean offset, spread)


def layernorm_steps(x: torch.Tensor, eps: float = 1e-5) -> dict[str, torch.Tensor]:
    """LayerNorm's steps in x's own dtype (every op's result rounded to it)."""
    mean = x.mean(dim=-1, keepdim=True)
    centered = x - mean
    var = (centered * centered).mean(dim=-1, keepdim=True)
    var_naive = (x * x).mean(dim=-1, keepdim=True) - mean * mean
    out = centered * torch.rsqrt(var + eps)
    return {"mean": mean, "variance": var, "variance_naive": var_naive, "output": out}


def layernorm_rows(device: str) -> list[dict]:
    """Errors of each LayerNorm step against fp64: the mean in units of the input's standard
    deviation (what the centering needs), the variances relative, the output absolute (it is
    already normalized); `nonfinite_fraction` counts overflows (inf) and inf-inf (nan)."""
    rows = []
    gen = torch.Generator().manual_seed(0)
    for offset, spread in LN_CASES:
        base = offset + spread * torch.randn(
            LN_ROWS, LN_FEATURES, generator=gen, dtype=torch.float64
        )
        ref = layernorm_steps(base.to(device))
        scale = {
            "mean": ref["variance"].sqrt(),
            "variance": ref["variance"].abs(),
            "variance_naive": ref["variance"].abs(),
            "output": torch.ones_like(ref["output"]),
        }
        kinds = {"mean": "per input std", "output": "absolute"}
        for dtype in ("fp32", "fp16", "bf16"):
            got = layernorm_steps(base.to(device=device, dtype=DTYPES[dtype]))
            for quantity, value in got.items():
                v = value.double()
                finite = torch.isfinite(v)
                err = ((v - ref[quantity]).abs() / scale[quantity])[finite]
                rows.append(
                    {
                        "device": device,
                        "dtype": dtype,
                        "offset": offset,
                        "spread": spread,
                        "quantity": quantity,
                        "nonfinite_fraction": float((~finite).double().mean()),
                        "max_error": float(err.max()) if err.numel() else float("nan"),
                        "mean_error": float(err.mean()) if err.numel() else float("nan"),
                        "error_kind": kinds.get(quantity, "relative"),
                        "status": "ok",
                    }
                )
    return rows


def run(args) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The three tables on each device of the block (a device not present: `skipped` rows)."""
    base = provenance(args.machine, args.preset, args.edition)
    acc, dts, ln = [], [], []
    for device in args.block.devices:
        if device == "cuda" and not torch.cuda.is_available():
            skipped = {"device": device, "status": "skipped: no CUDA device"}
            acc.append(skipped)
            dts.append(skipped)
            ln.append(skipped)
            continue
        acc += accumulation_rows(device)
        dts += dtype_rows(device)
        ln += layernorm_rows(device)

    def frame(rows: list[dict]) -> pd.DataFrame:
        return pd.DataFrame([{**base, **r} for r in rows])

    return frame(acc), frame(dts), frame(ln)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run", help="the stage's job: its three CSVs (--out: accumulation)")
    add_run_arguments(p)
    add_block_argument(p, PrecisionKnobs)
    p.add_argument("--dtypes-out", required=True)
    p.add_argument("--layernorm-out", required=True)
    args = ap.parse_args(argv)
    if args.out is None:
        p.error("--out is required")
    configure("precision")
    with Stopwatch() as job:
        acc, dts, ln = run(args)
    write_csv(acc, args.out)
    write_csv(dts, args.dtypes_out)
    write_csv(ln, args.layernorm_out)
    log.info("wrote %s, %s, %s in %.1f s", args.out, args.dtypes_out, args.layernorm_out, job.s)


if __name__ == "__main__":
    main()
