"""The benchmark's `engines` axis: the training step of each (size, context) point through the
engine (`fast`: engine/step.py) beside the plain model's rows, and a compiled HuggingFace GPT-2
of the same width and depth (`hf_gpt2`) where `transformers` is importable (a `skipped` row
otherwise). Train steps only: the engine changes the step (loss, optimizer, checkpointing), and
its forward is the plain model's but for the attention.

Rows carry `engine` (the plain grid's rows: `plain`) and are timed by the same harness.
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F

from cs336_systems.core import costs, own_model
from cs336_systems.core.device import autocast, memory_shortfall
from cs336_systems.core.harness import (
    peak_memory_mb,
    pipelined_ms,
    release_memory,
    run_point,
    summarize,
    time_steps,
)
from cs336_systems.model import VOCAB_SIZE, build_model, size_spec
from cs336_systems.planning.log import get_logger, point, status_level
from cs336_systems.stages.benchmark.plan import engine_points

ENGINES = ("plain", "fast", "hf_gpt2")
log = get_logger(__name__)


def _batch(context_length: int, batch_size: int, device):
    g = torch.Generator(device=device).manual_seed(0)
    shape = (batch_size, context_length)
    x = torch.randint(0, VOCAB_SIZE, shape, device=device, generator=g)
    return x, torch.randint(0, VOCAB_SIZE, shape, device=device, generator=g)


def fast_step(size, context_length, batch_size, device, precision, compiled, edition=None):
    from cs336_systems.engine.step import Engine, EngineOptions

    torch.manual_seed(0)
    with device:
        lm = build_model(size, context_length, edition=edition)
    x, y = _batch(context_length, batch_size, device)
    engine = Engine.build(lm, x, y, EngineOptions(precision=precision, compile=compiled))

    def step():
        return engine.step()

    # bf16 working weights (engine/master_adamw.py) run plain bf16 matmuls, not autocast's
    step.matmul_path = "matmul" if engine.plan.get("master_weights") else None
    return step


def hf_step(size, context_length, batch_size, device, precision, compiled, edition=None):
    from transformers import GPT2Config, GPT2LMHeadModel

    s = size_spec(size, edition)
    cfg = GPT2Config(
        vocab_size=VOCAB_SIZE,
        n_positions=context_length,
        n_embd=s["d_model"],
        n_layer=s["num_layers"],
        n_head=s["num_heads"],
        n_inner=s["d_ff"],
        resid_pdrop=0.0,  # no dropout, as our model
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    torch.manual_seed(0)
    with device:  # initialized on the device: an xl built on the host takes seconds of CPU
        model = GPT2LMHeadModel(cfg)
    net = torch.compile(model) if compiled else model
    opt = torch.optim.AdamW(
        model.parameters(), lr=1e-4, weight_decay=0.01, fused=device.type == "cuda"
    )
    x, y = _batch(context_length, batch_size, device)

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast(precision, device):
            logits = net(input_ids=x).logits
            loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        loss.backward()
        opt.step()

    return step


def state_shortfall(size: str, device, edition=None) -> str | None:
    """A `skipped:` status, before building anything, when the fp32 training state alone
    (weights, gradients, AdamW's two moments: 16 bytes per parameter) exceeds free memory."""
    s = size_spec(size, edition)
    need = 16 * costs.param_count(VOCAB_SIZE, s["d_model"], s["num_layers"], s["d_ff"])
    return memory_shortfall(need / 2**20, device, f"{size}'s fp32 training state")


def engine_rows(
    engines,
    size,
    context_length,
    precisions,
    compiles,
    batch_size,
    warmup,
    steps,
    device,
    fixed,
    edition=None,
) -> list[dict]:
    """Rows of the train step through each engine other than `plain` (the grid's own rows)."""
    rows = []
    for engine in [e for e in engines if e != "plain"]:
        points = engine_points(engine, precisions, compiles)
        for prec, comp in points:
            row = {
                **fixed,
                "engine": engine,
                "mode": "train_step",
                "precision": prec,
                "compile": comp,
                "warmup_steps": warmup,
                "measure_steps": steps,
            }
            with point(engine, prec, comp):
                if own_model.spec_for(size) is not None:
                    row["status"] = f"skipped: {engine} runs the course's model, not {size}"
                elif engine == "hf_gpt2" and importlib.util.find_spec("transformers") is None:
                    row["status"] = "skipped: transformers not installed"
                elif why := state_shortfall(size, device, edition):
                    row["status"] = why
                else:
                    make = fast_step if engine == "fast" else hf_step

                    def run(make=make, prec=prec, comp=comp):
                        step = make(
                            size,
                            context_length,
                            batch_size,
                            device,
                            prec,
                            comp == "compiled",
                            edition,
                        )
                        if device.type == "cuda":
                            torch.cuda.reset_peak_memory_stats(device)
                        warm, times = time_steps(step, warmup, steps, device)
                        path = getattr(step, "matmul_path", None)
                        return {
                            **summarize(times, "step"),
                            "first_step_ms": (warm or times)[0],
                            "pipelined_ms": pipelined_ms(step, steps, device),
                            "peak_memory_mb": peak_memory_mb(device),
                            **({"matmul_path": path} if path else {}),
                        }

                    res = run_point(run)
                    row.update({"status": res.status, **(res.value or {})})
                    release_memory()
                log.log(status_level(row["status"]), "%s", row["status"])
            rows.append(row)
    return rows
