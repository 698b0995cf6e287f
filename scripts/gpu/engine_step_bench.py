"""GPU check of the engine (scripts/gpu/engine_check.sh): one bf16 AdamW training step of the 2026
xl (2560/10240/32/32, vocab 10000) at context 512, batch 4: the plain model (compiled),
the engine (eager blocks, compiled blocks) and a compiled HuggingFace GPT-2 of the same width and
depth, timed with triton.testing.do_bench, MFU against a bf16 matmul ceiling measured here.

    python3 scripts/gpu/engine_step_bench.py OUT_DIR
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from cs336_systems.core.costs import train_step_flops
from cs336_systems.core.harness import is_oom, issue_ms, short_reason
from cs336_systems.engine.step import Engine, EngineOptions
from cs336_systems.model import TransformerLM, size_spec

# the 2026 size (ENGINE_SIZE, default xl) at context 512, batch 4
_SPEC = size_spec(os.environ.get("ENGINE_SIZE", "xl"), 2026)
D, DFF, L, H = (_SPEC[k] for k in ("d_model", "d_ff", "num_layers", "num_heads"))
V, N, B = 10_000, 512, 4
WARMUP_MS, REP_MS = 500, 2000
# which runs (comma-separated names of `runs` in main; all by default) and whether to profile one
# step of each with torch.profiler (top kernels by GPU time, written as <run>_kernels.txt)
RUNS = os.environ.get("ENGINE_RUNS", "")
PROFILE = os.environ.get("ENGINE_PROFILE", "0") == "1"


def kernel_table(step, out: Path, name: str) -> None:
    """One profiled step: GPU time by kernel (top 25) and by family, printed and written."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    events.sort(key=lambda e: -e.self_device_time_total)
    total = sum(e.self_device_time_total for e in events) / 1e3
    families: dict[str, float] = {}
    for e in events:
        k = e.key.lower()
        fam = next((f for f, pats in FAMILIES.items() if any(p in k for p in pats)), "other")
        families[fam] = families.get(fam, 0.0) + e.self_device_time_total / 1e3
    lines = [f"{name}: GPU busy {total:.1f} ms in one step"]
    lines += [f"  {f:12s} {ms:8.2f} ms" for f, ms in sorted(families.items(), key=lambda x: -x[1])]
    for e in events[:25]:
        lines.append(f"  {e.self_device_time_total / 1e3:8.2f} ms x{e.count:4d}  {e.key[:110]}")
    text = "\n".join(lines)
    print(text, flush=True)
    (out / f"{name}_kernels.txt").write_text(text + "\n")


FAMILIES = {
    "gemm": ("gemm", "sm90_xmma", "cutlass", "nvjet", "matmul", "mm_"),
    "flash": ("_attn", "flash", "fwd_kernel", "bwd_", "dkdv", "_dq"),
    "adam": ("adam",),
    "triton_fused": ("triton_",),
    "copy_cast": ("copy", "convert", "cast", "to_copy"),
    "reduce": ("reduce", "softmax", "logsumexp"),
    "elementwise": ("elementwise", "vectorized"),
}


def ceiling() -> float:
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = do_bench(lambda: a @ b, warmup=200, rep=1000)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def batch():
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randint(0, V, (B, N), device="cuda", generator=g)
    y = torch.randint(0, V, (B, N), device="cuda", generator=g)
    return x, y


def lm():
    torch.manual_seed(0)
    with torch.device("cuda"):
        return TransformerLM(V, N, D, L, H, DFF)


def plain(compiled: bool):
    model = lm()
    net = torch.compile(model) if compiled else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    x, y = batch()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(net(x).flatten(0, 1).float(), y.flatten())
        loss.backward()
        opt.step()

    return step, "none"


def engine(compiled: bool, **options):
    x, y = batch()
    e = Engine.build(lm(), x, y, EngineOptions(precision="bf16", compile=compiled, **options))
    return e.step, e.plan["strategy"]


def hf_peer():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        vocab_size=V,
        n_positions=N,
        n_embd=D,
        n_layer=L,
        n_head=H,
        n_inner=DFF,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )  # no dropout, as ours
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg).cuda()
    net = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    x, y = batch()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = net(input_ids=x).logits
            loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        loss.backward()
        opt.step()

    return step, "none"


def hf_flops() -> float:
    """GPT-2's own count: 4 d^2 attention + 2 d d_ff MLP per layer, the tied head d V."""
    n = L * (4 * D * D + 2 * D * DFF) + D * V
    return 6.0 * n * B * N + L * B * 3.5 * (4.0 * N * N * D / 2)


def main() -> None:
    out = Path(sys.argv[1]) / os.environ.get("ENGINE_SIZE", "xl")
    out.mkdir(parents=True, exist_ok=True)
    peak = ceiling()
    print(f"bf16 matmul ceiling (8192^3, do_bench): {peak:.0f} TFLOP/s", flush=True)
    ours = train_step_flops(V, D, L, DFF, B, N)
    runs = {
        "plain_compiled": lambda: plain(True),
        "engine_eager": lambda: engine(False),
        "engine_compiled": lambda: engine(True),
        "engine_compiled_sdpa": lambda: engine(True, attention="sdpa"),
        "engine_compiled_fp32w": lambda: engine(True, master_weights=False, checkpoint="none"),
        "hf_gpt2_compiled": hf_peer,
    }
    if RUNS:
        runs = {k: v for k, v in runs.items() if k in RUNS.split(",")}
    rows = []
    for name, make in runs.items():
        row = {"run": name, "peak_tflops": peak}
        try:
            if name.startswith("hf"):
                import importlib.util

                if importlib.util.find_spec("transformers") is None:
                    raise ModuleNotFoundError("skipped: transformers not installed")
            torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            step, strategy = make()
            step()
            torch.cuda.synchronize()
            setup_s = time.perf_counter() - t0
            ms = do_bench(step, warmup=WARMUP_MS, rep=REP_MS)
            host_ms = issue_ms(step, 5)
            from torch._dynamo.utils import counters

            breaks = sum(counters["graph_break"].values())
            print(f"{name}: dynamo {dict(counters['stats'])}, graph breaks {breaks}", flush=True)
            if PROFILE:
                kernel_table(step, out, name)
            flops = hf_flops() if name.startswith("hf") else ours
            row.update(
                status="ok",
                checkpointing=strategy,
                step_ms=ms,
                setup_s=setup_s,
                host_ms=host_ms,
                tflops=flops / (ms * 1e-3) / 1e12,
                mfu=flops / (ms * 1e-3) / 1e12 / peak,
                peak_gb=torch.cuda.max_memory_allocated() / 1e9,
            )
        except ModuleNotFoundError as exc:
            row["status"] = str(exc)
        except Exception as exc:  # noqa: BLE001 - every failure is a row
            row["status"] = ("oom: " if is_oom(exc) else "error: ") + short_reason(exc)
        rows.append(row)
        print(json.dumps(row), flush=True)
        step = None
        # what the last run compiled holds its model (dynamo's guards): drop it before the next
        torch._dynamo.reset()
        gc.collect()
        torch.cuda.empty_cache()
    (out / "engine_step.json").write_text(json.dumps(rows, indent=1))
    print("target: engine_compiled MFU >= 0.55 (issue 22)")
    for r in rows:
        if r["status"] == "ok":
            print(
                f"{r['run']:18s} {r['step_ms']:8.1f} ms  {r['tflops']:6.0f} TFLOP/s  "
                f"MFU {r['mfu']:.1%}  host {r['host_ms']:.1f} ms  peak {r['peak_gb']:.1f} GB  setup {r['setup_s']:.0f} s  "
                f"ckpt {r['checkpointing']}"
            )
        else:
            print(f"{r['run']:18s} {r['status']}")


if __name__ == "__main__":
    main()
