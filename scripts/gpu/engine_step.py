"""GPU timing of the training step with and without bf16 working weights + fp32 masters (issue 22):
the 2026 xl and small at context 512, batch 4, bf16, each a compiled AdamW step through

- plain: core/workload.py's step, torch.compile'd whole model, naive attention, fused AdamW (as
  the benchmark stage runs it);
- engine: engine/step.py, compiled blocks, master_weights False (fp32 weights, autocast casts,
  fused torch AdamW);
- engine_mw: the same with master_weights True (bf16 Linear weights, engine/master_adamw.py).

Per-phase ms (forward, backward, optimizer) from CUDA events at the step's marks
(core/harness.py:time_marked_steps), the whole step on the synchronized host clock, MFU by
core/costs.py:train_step_flops (6 N over the matmul parameters x tokens + the causal attention
term) against PEAK_TFLOPS (the measured autocast F.linear bf16 ceiling of the H100, 605 TFLOP/s;
set PEAK_TFLOPS for another GPU). DEVICE, SIZES and COMPILE (env) exist for a CPU smoke run
(`DEVICE=cpu SIZES=tiny COMPILE=0`, master weights then through the torch fallback). A point that fails (OOM, error) or that the wall budget
(BUDGET_S, default 280 s) leaves no time for is a row with its status. Writes engine_step.csv.

    python3 scripts/gpu/engine_step.py OUT_DIR
"""

from __future__ import annotations

import gc
import os
import sys
import time
from pathlib import Path

import torch

from cs336_systems.core.costs import train_step_flops
from cs336_systems.core.harness import is_oom, short_reason, summarize, time_marked_steps
from cs336_systems.core.results import write_csv
from cs336_systems.core.workload import Workload
from cs336_systems.engine.step import Engine, EngineOptions
from cs336_systems.model import VOCAB_SIZE, build_model, size_spec

CTX, BATCH, EDITION = 512, 4, 2026
WARMUP, STEPS = 3, 10
PEAK = float(os.environ.get("PEAK_TFLOPS", 605))
BUDGET_S = float(os.environ.get("BUDGET_S", 280))
NEEDS_S = {
    "xl": 75,
    "small": 25,
    "tiny": 5,
}  # a point's compile + warm-up + steps, at most (estimate)
DEVICE = torch.device(os.environ.get("DEVICE", "cuda"))
COMPILE = os.environ.get("COMPILE", "1") == "1"
SIZES = os.environ.get("SIZES", "xl,small").split(",")
POINTS = [(s, v) for s in SIZES for v in ("engine_mw", "engine", "plain")]
SPANS = {
    "plain": {"forward": ("start", "forward"), "backward": ("forward", "backward"),
              "optimizer": ("backward", "optimizer")},
    "engine": {"forward": ("start", "forward"), "backward": ("forward", "backward"),
               "optimizer": ("comm", "optimizer")},
}  # fmt: skip


def build(size: str, variant: str):
    device = DEVICE
    if variant == "plain":
        work = Workload.build(size, CTX, BATCH, device, attention="naive", edition=EDITION)
        step, _ = work.step("train_step", "bf16", compiled=COMPILE)
        return step, SPANS["plain"], {"master_weights": False, "checkpointing": "none"}
    torch.manual_seed(0)
    with device:
        lm = build_model(size, CTX, edition=EDITION)
    g = torch.Generator(device=device).manual_seed(0)
    x, y = (torch.randint(0, VOCAB_SIZE, (BATCH, CTX), device=device, generator=g) for _ in "xy")
    opts = EngineOptions(precision="bf16", compile=COMPILE, master_weights=variant == "engine_mw")
    engine = Engine.build(lm, x, y, opts)

    def step(clock):
        clock.mark("start")
        engine.step(phase=clock.mark)

    plan = {
        "master_weights": engine.plan["master_weights"],
        "checkpointing": engine.plan["strategy"],
    }
    return step, SPANS["engine"], plan


def measure(size: str, variant: str) -> dict:
    s = size_spec(size, EDITION)
    flops = train_step_flops(VOCAB_SIZE, s["d_model"], s["num_layers"], s["d_ff"], BATCH, CTX)
    row = {"size": size, "variant": variant, "context": CTX, "batch": BATCH, "peak_tflops": PEAK}
    cuda = DEVICE.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    step, spans, plan = build(size, variant)
    times = time_marked_steps(step, WARMUP, STEPS, DEVICE, spans, with_warmup=True)
    ms = summarize(times["step"], "step")["step_ms_median"]
    row.update(plan, status="ok", setup_s=time.perf_counter() - t0 - sum(times["step"]) / 1e3)
    row.update(step_ms=ms, first_step_ms=times["warmup"][0])
    for name in spans:
        row[f"{name}_ms"] = summarize(times[name], name)[f"{name}_ms_median"]
    row.update(tflops=flops / (ms * 1e-3) / 1e12, mfu=flops / (ms * 1e-3) / 1e12 / PEAK)
    row["peak_gb"] = torch.cuda.max_memory_allocated() / 1e9 if cuda else float("nan")
    return row


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    start, rows = time.perf_counter(), []
    for size, variant in POINTS:
        left = BUDGET_S - (time.perf_counter() - start)
        if left < NEEDS_S[size]:
            row = {"size": size, "variant": variant, "status": f"skipped: {left:.0f} s of the "
                   f"wall budget left, a point needs ~{NEEDS_S[size]} s (BUDGET_S)"}  # fmt: skip
        else:
            try:
                row = measure(size, variant)
            except Exception as exc:  # noqa: BLE001 - every failure is a row
                status = ("oom: " if is_oom(exc) else "error: ") + short_reason(exc)
                row = {"size": size, "variant": variant, "status": status}
        rows.append(row)
        torch._dynamo.reset()
        gc.collect()
        if DEVICE.type == "cuda":
            torch.cuda.empty_cache()
        if row["status"] == "ok":
            print(
                f"{size:5s} {variant:9s} step {row['step_ms']:7.1f} ms (fwd {row['forward_ms']:.1f}"
                f" bwd {row['backward_ms']:.1f} opt {row['optimizer_ms']:.1f})  "
                f"MFU {row['mfu']:.1%} of {PEAK:.0f}  peak {row['peak_gb']:.1f} GB  "
                f"setup {row['setup_s']:.0f} s  ckpt {row['checkpointing']}",
                flush=True,
            )
        else:
            print(f"{size:5s} {variant:9s} {row['status']}", flush=True)
        write_csv(rows, out / "engine_step.csv")
    print(f"wall {time.perf_counter() - start:.0f} s; target: xl engine_mw MFU >= 55%, and "
          "engine_mw faster than engine by the predicted ~12-14 ms on xl")  # fmt: skip


if __name__ == "__main__":
    main()
