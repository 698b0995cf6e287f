"""The time budget of a preset: an estimate of every job the workflow plans, from the config.

    python -m cs336_systems.budget                       # every preset: logs the verdicts
    python -m cs336_systems.budget --out docs/budgets.md  # and writes the tables

Each job costs its process start, what it compiles, and its steps: FLOPs at a fraction of the
device's peak (`Device`), plus per-point overheads named in `Device` (do_bench windows, a
profiler capture, a memory snapshot). The numbers are estimates to plan with, not measurements;
the constants are calibrated on the reference runs' job logs (report/reference/<machine>/jobs/:
budget/measured.py, whose tables budget/tables.py writes into docs/budgets.md). A preset
whose sum is above its budget fails `check` (tests/test_budget.py holds gpu to 25 minutes on
one H100 and cpu to 5 on 2 cores). The sizes are the run's edition's (config `edition`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from cs336_systems.budget.devices import CPU2, H100, Device
from cs336_systems.core import costs
from cs336_systems.model import VOCAB_SIZE, size_spec
from cs336_systems.planning.config import load_yaml, with_stage_defaults
from cs336_systems.planning.edition import DEFAULT_EDITION, edition_overrides
from cs336_systems.stages.benchmark import plan as benchmark_plan
from cs336_systems.stages.benchmark.engines import engine_points
from cs336_systems.stages.flash.plan import seq_cap
from cs336_systems.stages.leaderboard.plan import reduced_seconds
from cs336_systems.stages.profile.probe import grid_contexts

ROOT = Path(__file__).resolve().parents[3]


DEVICES = {"gpu": H100, "full": H100, "cpu": CPU2}


@dataclass
class Job:
    stage: str
    job: str
    seconds: float
    how: str
    parts: dict = field(default_factory=dict)


def _spec(size: str, ed: int) -> dict:
    return size_spec(size, ed)


def _params(size: str, ed: int = DEFAULT_EDITION) -> float:
    s = _spec(size, ed)
    return costs.param_count(VOCAB_SIZE, s["d_model"], s["num_layers"], s["d_ff"])


def rate(dev: Device, precision: str) -> float:
    """FLOP/s a model step reaches in this precision."""
    return dev.tflops.get(precision, dev.tflops["fp32"]) * 1e12


# forwards' worth of launches per mode (backward about twice a forward, the optimizer a half)
LAUNCHES = {"forward": 1.0, "forward_backward": 3.0, "train_step": 3.5}


def step_s(
    dev: Device, size: str, ctx: int, batch: int, mode: str, precision: str,
    ed: int = DEFAULT_EDITION,
) -> float:  # fmt: skip
    """A step's FLOPs at the reached rate, or its kernel launches where those take longer."""
    s = _spec(size, ed)
    flops = costs.model_flops(
        VOCAB_SIZE, s["d_model"], s["num_layers"], s["d_ff"], batch, ctx, mode
    )
    launches = dev.launch_s_per_layer * s["num_layers"] * LAUNCHES.get(mode, 3.5)
    return max(flops / rate(dev, precision), launches)


def skipped_for_cost(
    dev: Device, size: str, ctx: int, batch: int, mode: str, precision: str, steps: int,
    limit: float | None, ed: int = DEFAULT_EDITION,
) -> bool:  # fmt: skip
    """The benchmark stage's cost guard (stages/benchmark/mfu.py too_costly): `steps` steps'
    FLOPs at the ceilings stage's measured matmul rate above max_point_s: a `skipped` row."""
    if not limit:
        return False
    s = _spec(size, ed)
    flops = costs.model_flops(VOCAB_SIZE, s["d_model"], s["num_layers"], s["d_ff"], batch, ctx,
                              mode)  # fmt: skip
    peak = (dev.peak_tflops or dev.tflops).get(precision, dev.tflops["fp32"]) * 1e12
    return steps * flops / peak > limit


def step_gib(size: str, ctx: int, batch: int, mode: str, precision: str, ed: int) -> float:
    """core/costs.py's step memory (state + saved activations), what the stages' checks read."""
    s = _spec(size, ed)
    b = costs.step_memory_bytes(VOCAB_SIZE, s["d_model"], s["num_layers"], s["num_heads"],
                                s["d_ff"], batch, ctx, mode, precision)  # fmt: skip
    return b["total_bytes"] / 2**30


def fits(dev: Device, gib: float, factor: float = 1.0) -> bool:
    return dev.memory_gib is None or gib <= factor * dev.memory_gib


def model_compile_s(dev: Device, size: str, ed: int) -> float:
    return dev.compile_s + dev.compile_s_per_layer * _spec(size, ed)["num_layers"]


def _build(dev: Device, size: str, ed: int, n: int = 1) -> float:
    return n * dev.build_s_per_gparam * _params(size, ed) / 1e9


def _benchmark(cfg: dict, dev: Device, ed: int = DEFAULT_EDITION) -> list[Job]:
    """One job per point: its plain grid (points the memory model refuses, or above
    max_point_s, cost nothing: `skipped` rows decided before allocating), a compile per compiled
    precision, and in the first attention's job the engines (engines.py: engine_points), each
    compiled engine one more compile; the engines skip when the fp32 state (16 B a parameter)
    does not fit."""
    jobs = []
    steps = cfg["warmup_steps"] + cfg["measure_steps"]
    limit = cfg.get("max_point_s")
    batch = cfg["batch_size"]
    c_modes = benchmark_plan.compile_filter(cfg, "modes").split(",")
    c_precs = benchmark_plan.compile_filter(cfg, "precisions").split(",")
    for p in benchmark_plan.points(cfg):
        size, ctx = p["size"], p["context_length"]
        compiles = benchmark_plan.compile_arg(cfg, size, ctx, p["attention"]).split(",")
        run, graphs = 0.0, set()
        for comp in compiles:
            for prec in cfg["precisions"]:
                for mode in cfg["modes"]:
                    if comp == "compiled" and (mode not in c_modes or prec not in c_precs):
                        continue
                    if not fits(dev, step_gib(size, ctx, batch, mode, prec, ed)):
                        continue  # a `skipped: ... needs` row
                    if skipped_for_cost(dev, size, ctx, batch, mode, prec, steps, limit, ed):
                        continue  # a `skipped:` row
                    t = steps * step_s(dev, size, ctx, batch, mode, prec, ed)
                    run += t
                    if comp == "compiled":
                        graphs.add(prec)  # about a minute per model shape and precision
        engines = benchmark_plan.engines_arg(cfg, p["attention"]).split(",")
        n_eng, setup = 0, 0.0
        state_fits = fits(dev, 16 * _params(size, ed) / 2**30)
        for engine in [e for e in engines if e != "plain" and state_fits]:
            for prec, comp in engine_points(engine, cfg["precisions"], compiles):
                if skipped_for_cost(dev, size, ctx, batch, "train_step", prec, steps, limit, ed):
                    continue
                t = steps * step_s(dev, size, ctx, batch, "train_step", prec, ed)
                n_eng += 1
                run += t
                setup += _build(dev, size, ed) + dev.engine_s  # each builds its own model
                # the engine compiles per block from the run's cache (measured: its compiled row
                # costs what its eager one does); the HF peer compiles a whole model
                if comp == "compiled" and engine != "fast":
                    graphs.add(f"{engine} {prec}")
        setup += len(graphs) * model_compile_s(dev, size, ed)
        build = _build(dev, size, ed) if run else 0.0
        if run and "train_step" in cfg["modes"]:
            build += dev.first_train_step_s
        if run and p["attention"] == "flash_triton":
            setup += dev.triton_model_s
        total = dev.job_start_s + build + setup + run
        how = f"{len(graphs)} compiled graphs, {n_eng} engine rows, {run:.0f} s of steps"
        how = how if run else "every point skipped before allocating"
        jobs.append(Job("benchmark", f"{size} ctx{ctx} {p['attention']}", total, how))
    w = cfg["warmup_sweep"]
    for size in w["sizes"]:
        n = sum(x + w["measure_steps"] for x in w["warmups"])
        t = n * step_s(dev, size, w["context_length"], batch, w["mode"], w["precision"], ed)
        build = _build(dev, size, ed, len(w["warmups"]))
        build += dev.first_train_step_s if w["mode"] == "train_step" else 0.0
        jobs.append(Job("benchmark", f"warm-up sweep {size}", dev.job_start_s + build + t,
                        f"{len(w['warmups'])} fresh models, {n} steps"))  # fmt: skip
    return jobs


def _memory(cfg: dict, dev: Device, ed: int = DEFAULT_EDITION) -> list[Job]:
    """One job per size: every (context, mode, precision) point without checkpointing (those
    above skip_factor x the device's memory skipped before allocating), the checkpointed ones
    at checkpoint.contexts (recomputation: 4/3 of a training step), a snapshot each; part (f):
    one block per (context, precision), an Nsight capture per nsys context and precision
    (GPU only: `skipped` rows without CUDA)."""
    jobs = []
    batch, factor = cfg["batch_size"], cfg.get("skip_factor", 1.5)
    ck = cfg.get("checkpoint", {"contexts": [], "modes": []})
    for size in cfg["sizes"]:
        run, points, skipped = 0.0, 0, 0
        layers = _spec(size, ed)["num_layers"]
        for ctx in cfg["context_lengths"]:
            for mode in cfg["modes"]:
                for prec in cfg["precisions"]:
                    step = (cfg["warmup_steps"] + 1) * step_s(dev, size, ctx, batch, mode, prec, ed)
                    if fits(dev, step_gib(size, ctx, batch, mode, prec, ed), factor):
                        points += 1
                        run += step
                    else:
                        skipped += 1
                    if ctx in ck["contexts"] and mode in ck["modes"]:
                        points += 1
                        run += step * (4 / 3 if mode != "forward" else 1.0)
                # part (f): one block's forward+backward per precision
                for prec in cfg["precisions"]:
                    run += 2 * step_s(dev, size, ctx, batch, "forward_backward", prec, ed) / layers
        nsys = len(cfg.get("nsys_contexts", [])) * len(cfg["precisions"]) if dev.gpus else 0
        total = dev.job_start_s + _build(dev, size, ed) + run + points * dev.snapshot_s
        total += nsys * (dev.job_start_s + dev.capture_s)
        jobs.append(Job("memory", size, total, f"{points} snapshots, {skipped} skipped, "
                                               f"{nsys} nsys captures"))  # fmt: skip
    return jobs


def probe_largest(cfg: dict, dev: Device, size: str, ed: int) -> tuple[int | None, int]:
    """The profile probe's result assumed from the memory model (core/costs.py
    step_memory_bytes of probe.mode within the device's memory; no limit on a CPU): the largest
    context it reaches doubling from probe.start up to probe.max, and how many it tries."""
    pr = cfg["probe"]
    largest, tried, ctx = None, 0, pr["start"]
    while ctx <= pr["max"]:
        tried += 1
        gib = step_gib(size, ctx, cfg["batch_size"], pr["mode"], cfg["precision"], ed)
        if not fits(dev, gib):
            break
        largest, ctx = ctx, ctx * 2
    return largest, tried


PROBE_TRY_S = 1.0


def _profile(cfg: dict, dev: Device, ed: int = DEFAULT_EDITION) -> list[Job]:
    jobs = []
    steps = cfg["warmup_steps"] + cfg["measure_steps"]
    batch = cfg["batch_size"]
    for size in cfg["sizes"]:
        run, points, how = 0.0, 0, ""
        contexts = cfg["context_lengths"]
        if contexts == "probe":
            pr = cfg["probe"]
            largest, tried = probe_largest(cfg, dev, size, ed)
            contexts = grid_contexts(largest, pr["above"], pr["count"])
            # a model and one step a tried context (H100, xl: 4 tries in 5 s, the model built
            # on the device), the failing one an `oom` row
            run += PROBE_TRY_S * tried
            ran = [pr["start"] << i for i in range(tried)][: tried if largest else 0]
            run += sum(step_s(dev, size, c, batch, pr["mode"], cfg["precision"], ed)
                       for c in ran if largest and c <= largest)  # fmt: skip
            how = f"probe: {tried} tried, contexts {contexts}; "
        h = cfg.get("harness", {})
        for ctx in contexts:
            if "forward" in cfg["modes"] and h.get("measure_steps"):
                # the harness's forward beside the capture (nsys_profile (a))
                n = h["warmup_steps"] + h["measure_steps"]
                run += n * step_s(dev, size, ctx, batch, "forward", cfg["precision"], ed)
            for mode in cfg["modes"]:
                points += 1
                if not fits(dev, step_gib(size, ctx, batch, mode, cfg["precision"], ed)):
                    run += dev.capture_s  # an `oom` row
                    continue
                run += dev.capture_s
                run += steps * step_s(dev, size, ctx, batch, mode, cfg["precision"], ed)
        run += _build(dev, size, ed)
        jobs.append(Job("profile", size, dev.job_start_s + run, f"{how}{points} captures"))
    return jobs


def _attention(cfg: dict, dev: Device, ed: int = DEFAULT_EDITION) -> list[Job]:
    """Per point: forward steps, then forward+backward steps; a forward is its two matmuls'
    FLOPs plus ~4 passes over the (n x n) fp32 scores, a backward twice the FLOPs and ~6
    passes (fitted on the H100's naive_compiled job)."""
    jobs = []
    fp32 = rate(dev, "fp32")
    for impl in cfg["impls"]:
        run = 0.0
        for d in cfg["head_dims"]:
            for n in cfg["seq_lens"]:
                flops = 4.0 * cfg["batch_size"] * n * n * d
                scores = 4.0 * cfg["batch_size"] * n * n / (dev.hbm_tbps * 1e12)
                fwd, bwd = flops / fp32 + 4 * scores, 2 * flops / fp32 + 6 * scores
                run += cfg["fwd_steps"] * fwd + (cfg["warmup_steps"] + cfg["bwd_steps"]) * (
                    fwd + bwd
                )
        # torch's automatic dynamic shapes: a static compile, then one dynamic one per head dim
        compiles = 1 + len(cfg["head_dims"]) if "compiled" in impl else 0
        points = len(cfg["head_dims"]) * len(cfg["seq_lens"])
        total = dev.job_start_s + dev.gpu_init_s + compiles * dev.small_compile_s + run
        total += points * 0.1
        jobs.append(Job("attention", impl, total, f"{points} points, {compiles} compiles"))
    return jobs


LEADERBOARD_CHECK_S = 4.5
# forward+backward runs a flash point times (H100 naive_eager bf16 n=65536: 2.5 s at 100 ms)
NAIVE_REPS = 25
# loading our Triton kernels' variants from the run's cache (results/<machine>/.cache/triton)
CACHED_PRECOMPILE_S = 5.0


def _flash(
    cfg: dict, dev: Device, ed: int = DEFAULT_EDITION, shared_cache: bool = True
) -> list[Job]:
    """`shared_cache`: the kernel_tests stage ran first and precompiled into the run's cache."""
    jobs = []
    caps = cfg.get("max_seq_len", {})
    for dtype in cfg["dtypes"]:
        points = 0
        run = 0.0
        flop_rate = rate(dev, dtype)
        for impl in cfg["impls"]:
            for d in cfg["head_dims"]:
                for n in cfg["seq_lens"]:
                    if n > seq_cap(caps, impl, dtype):
                        continue
                    points += 1
                    if impl == "sdpa_cudnn" and dtype == "fp32":
                        continue  # an `error` row at once: cuDNN has no fp32 attention
                    if impl.startswith("naive"):
                        # the (n x n) scores: an `oom` row above ~5 copies of them; a
                        # forward+backward ~30 passes over them (H100, bf16, n=65536: 100 ms)
                        scores = cfg["batch_size"] * n * n * (2 if dtype == "bf16" else 4)
                        if dev.memory_gib and 5 * scores > dev.memory_gib * 2**30:
                            continue
                        run += NAIVE_REPS * 30 * scores / (dev.hbm_tbps * 1e12)
                        continue
                    # fwd, bwd, fwd+bwd timed at least a few times each, plus the check
                    flops = 3.5 * 4.0 * cfg["batch_size"] * n * n * d / 2
                    slow = 10.0 if impl == "flash_pytorch" else 1.0
                    run += 8 * slow * flops / flop_rate
        compiles = len(cfg["head_dims"]) * 2 if "naive_compiled" in cfg["impls"] else 0
        # the kernel_tests job compiled the variants into the run's shared Triton cache
        pre = dev.triton_precompile_s if "flash_triton" in cfg["impls"] else 0.0
        pre = min(pre, CACHED_PRECOMPILE_S) if shared_cache else pre
        total = dev.job_start_s + dev.flash_setup_s + pre + compiles * dev.small_compile_s
        total += points * dev.point_s + run
        jobs.append(Job("flash", dtype, total, f"{points} points"))
    if cfg.get("target"):
        t = cfg["target"]
        points = len(t["impls"]) * len(t["head_dims"]) * len(t["seq_lens"])
        flops = sum(
            3.5 * 4.0 * t["batch_size"] * t["heads"] * n * n * d / 2
            for d in t["head_dims"]
            for n in t["seq_lens"]
        )
        pre = CACHED_PRECOMPILE_S if shared_cache else dev.triton_precompile_s
        total = dev.job_start_s + dev.flash_setup_s + pre + points * dev.point_s
        total += 8 * len(t["impls"]) * flops / rate(dev, t["dtype"])
        # three windows a point, and one a round per point with the paired rounds (rounds.py)
        windows = points * (3 + t.get("rounds", 0))
        total += windows * (t.get("warmup_ms", 0) + t.get("rep_ms", 0)) / 1e3
        jobs.append(Job("flash", "target", total, f"{points} points"))
    if cfg.get("leaderboard"):
        b = cfg["leaderboard"]
        # fwd, bwd, fwd+bwd windows and the correctness check (H100: 12 s an implementation)
        per = 3 * (b.get("warmup_ms", 500) + b.get("rep_ms", 2000)) / 1e3 + LEADERBOARD_CHECK_S
        pre = CACHED_PRECOMPILE_S if shared_cache else dev.triton_precompile_s
        total = dev.job_start_s + dev.flash_setup_s + pre + len(b["impls"]) * per
        jobs.append(Job("flash", "leaderboard", total, f"{len(b['impls'])} implementations"))
    return jobs


def _checkpointing(cfg: dict, dev: Device, ed: int = DEFAULT_EDITION) -> list[Job]:
    acc = cfg["accounting"]
    compiled = acc.get("compile_backend") == "inductor" and acc.get("device") != "meta"
    acc_s = dev.fixed_s["accounting"] if compiled else 5.0
    jobs = [Job("checkpointing", "accounting", dev.job_start_s + acc_s,
                "one block, eager and compiled")]  # fmt: skip
    size, ctx, batch = cfg["size"], cfg["context_length"], cfg["batch_size"]
    layers = cfg.get("num_layers", _spec(size, ed)["num_layers"])
    scale = layers / _spec(size, ed)["num_layers"]
    steps = cfg["warmup_steps"] + cfg["measure_steps"]
    s = _spec(size, ed)
    factor = cfg.get("skip_factor", 1.5)
    for prec in cfg["precisions"]:
        # no checkpointing and every block size k (saving about k/N of the activations) the
        # stage runs: those whose state + activations fit skip_factor x the device's memory
        b = costs.step_memory_bytes(VOCAB_SIZE, s["d_model"], s["num_layers"], s["num_heads"],
                                    s["d_ff"], batch, ctx, "train_step", prec)  # fmt: skip
        state, acts = scale * b["state_bytes"] / 2**30, scale * b["activation_bytes"] / 2**30
        sizes = [layers] + [k for k in cfg["block_sizes"] if k < layers]
        runs = sum(fits(dev, state + acts * min(k, layers) / layers, factor) for k in sizes)
        # nested strategies hold about one block's activations at a time
        runs += len(cfg.get("nested", []))
        t = runs * steps * 4 / 3 * scale * step_s(dev, size, ctx, batch, "train_step", prec, ed)
        build = _build(dev, size, ed) * scale  # once per precision
        total = len(sizes) + len(cfg.get("nested", []))
        jobs.append(Job("checkpointing", prec, dev.job_start_s + build + t,
                        f"{runs} of {total} strategies run, {steps} steps each"))  # fmt: skip
    return jobs


# do_bench's windows around a ceiling measurement on a GPU (100 ms warm-up, at least 100 ms of
# runs, reps ms where more: stages/ceilings/measure.py time_ms) and the calls it times first
DO_BENCH_CALLS = 6


def _ceilings(cfg: dict, dev: Device, ed: int = DEFAULT_EDITION) -> list[Job]:
    """Every (dtype, path, size) `repeats` times: on a GPU do_bench's windows and its first
    calls, on a CPU the warm-up and `reps` calls at the measured rate; the warm-up spin and the
    copy."""
    from cs336_systems.stages.ceilings.plan import sizes_of

    reps, repeats = cfg["reps"], cfg.get("repeats", 1)
    total, n = 0.0, 0
    for dtype, sizes in sizes_of(cfg).items():
        paths = 2 if dtype == "bf16" else 1  # bf16 also as the model runs it (autocast F.linear)
        rate_ = (dev.peak_tflops or dev.tflops).get(dtype, dev.tflops["fp32"]) * 1e12
        for size in sizes:
            call = 2.0 * size**3 / rate_
            one = (
                (0.1 + max(reps, 100) / 1e3 + DO_BENCH_CALLS * call)
                if dev.gpus
                else ((1 + reps) * call)
            )
            total += paths * repeats * one
            n += paths * repeats
    total += cfg.get("warm_s", 0) if dev.gpus else 0.0
    total += dev.job_start_s + dev.fixed_s["ceilings"]
    return [Job("ceilings", "ceilings", total, f"{n} matmul measurements and a copy")]


def _leaderboard(cfg: dict, dev: Device, ed: int = DEFAULT_EDITION) -> list[Job]:
    """gloo: the tiny configuration on one world of host processes (~30 s); NCCL on fewer
    GPUs than its world size: `skipped` rows and the reduced configuration on one GPU; else
    each variant's compile and steps at the 8B's FLOPs over the world."""
    world, variants = cfg["world_size"], cfg["variants"]
    ablations = cfg.get("ablations", [])
    if cfg["backend"] == "gloo":
        jobs = [Job("leaderboard", "runs", dev.job_start_s + dev.gloo_world_s,
                    f"{len(variants)} variants on {world} gloo processes")]  # fmt: skip
        if ablations:
            jobs.append(Job("leaderboard", "ablation", dev.job_start_s + dev.gloo_world_s,
                            f"{len(ablations)} ablation rows on {world} gloo processes"))  # fmt: skip
        return jobs
    if world > dev.gpus:
        # the reduced configuration's estimate sits beside its knobs (stages/leaderboard/plan.py)
        reduced = dev.job_start_s + reduced_seconds(cfg, costs.train_step_flops, rate(dev, "bf16"))
        jobs = [Job("leaderboard", "reduced", reduced,
                    f"{world} GPUs needed: the reduced configuration on one")]  # fmt: skip
        if ablations:
            jobs.append(Job("leaderboard", "ablation", dev.job_start_s,
                            f"{world} GPUs needed: skipped rows"))  # fmt: skip
        return jobs
    flops = costs.train_step_flops(cfg["vocab"], cfg["d_model"], cfg["num_layers"], cfg["d_ff"],
                                   cfg["batch"], cfg["context_length"])  # fmt: skip
    steps = cfg["warmup_steps"] + cfg["measure_steps"]
    flop_rate = rate(dev, "bf16") * world
    compiled = dev.compile_s + dev.compile_s_per_layer * cfg["num_layers"]
    per = (compiled if cfg.get("compile") else 0.0) + steps * flops / flop_rate
    jobs = [Job("leaderboard", "runs", dev.job_start_s + len(variants) * per,
                f"{len(variants)} variants on {world} GPUs")]  # fmt: skip
    if ablations:  # the memory model skips the plain loss at once; each other row runs
        run = [a for a in ablations if a != "plain_loss"]
        jobs.append(Job("leaderboard", "ablation", dev.job_start_s + len(run) * per,
                        f"{len(ablations)} ablation rows on {world} GPUs"))  # fmt: skip
    return jobs


def _fixed(stage: str, how: str):
    return lambda cfg, dev, ed=None: [Job(stage, stage, dev.job_start_s + dev.fixed_s[stage], how)]


def _distributed(stage: str, jobs_of):
    """One job per variant group (or backend): NCCL on fewer GPUs than its world size is status
    rows at once; gloo runs on the host's cores (a world of processes, ~30 s per world)."""

    def estimate(cfg: dict, dev: Device, ed: int = DEFAULT_EDITION) -> list[Job]:
        jobs = []
        for name, backend, worlds in jobs_of(cfg):
            runs = [w for w in worlds if backend == "gloo" or w <= dev.gpus]
            how = f"{len(runs)} of {len(worlds)} world sizes run" + (
                "" if len(runs) == len(worlds) else f" (NCCL: {dev.gpus} GPUs here)"
            )
            jobs.append(Job(stage, name, dev.job_start_s + dev.gloo_world_s * len(runs), how))
        return jobs

    return estimate


def _ddp(cfg: dict, dev: Device, ed: int = DEFAULT_EDITION) -> list[Job]:
    """variants and sharding; where NCCL has fewer GPUs than the world, `variants` still
    measures its compute-only baseline in one process (stages/ddp/measure.py: run)."""
    jobs = _distributed(
        "ddp", lambda c: [(j, c["backend"], [c["world_size"]]) for j in ("variants", "sharding")]
    )(cfg, dev, ed)
    if cfg["backend"] == "nccl" and 1 <= dev.gpus < cfg["world_size"]:
        size, steps = cfg["size"], cfg["warmup_steps"] + cfg["measure_steps"]
        step = step_s(dev, size, cfg["context_length"], cfg["batch_per_rank"], "train_step",
                      "fp32", ed)  # fmt: skip
        base = dev.job_start_s + _build(dev, size, ed) + steps * step
        v = jobs[0]
        jobs[0] = Job(v.stage, v.job, v.seconds + base, f"{v.how}; the baseline on one GPU")
    return jobs


ESTIMATES = {
    "kernel_tests": lambda cfg, dev, ed=None: [
        Job(
            "kernel_tests",
            "kernel_tests",
            dev.job_start_s + dev.kernel_tests_s,
            "the kernels' pytest suite, xdist workers",
        )
    ],  # fmt: skip
    "ceilings": _ceilings,
    "benchmark": _benchmark,
    "memory": _memory,
    "profile": _profile,
    "attention": _attention,
    "flash": _flash,
    "precision": _fixed("precision", "the accumulation snippets"),
    "checkpointing": _checkpointing,
    "leaderboard": _leaderboard,
    "arithmetic": _fixed("arithmetic", "arithmetic on the ceilings' and allreduce's CSVs"),
    "allreduce": _distributed(
        "allreduce", lambda cfg: [(b, b, cfg["world_sizes"]) for b in cfg["backends"]]
    ),
    "ddp": _ddp,
    "fsdp": _distributed("fsdp", lambda cfg: [("runs", cfg["backend"], [cfg["world_size"]])]),
}
# the aggregate, plot and report jobs: a process each (the reference H100 run: about 30 local
# jobs in the 42 s between 21.2 min of wall time and 20.5 with a logged job running)
LOCAL_JOB_S = 1.5


# the stages whose grids or problems differ between the editions: a 2025 run is these under its
# own machine tag (README, "Presets and configuration"); the others answer both editions alike
EDITION_STAGES = ("ceilings", "benchmark", "memory", "profile", "arithmetic")


def run_config(root: Path = ROOT, edition: int | None = None) -> dict:
    """The default run's config (`edition`: that edition's grids instead of config.yaml's)."""
    config = load_yaml(root / "config" / "config.yaml")
    if edition is not None:
        config["edition"] = edition
    stages = with_stage_defaults(config, root / "config" / "stages")
    problems = edition_overrides(config, stages, config.get("edition", DEFAULT_EDITION))
    if problems:
        raise ValueError(f"config/: malformed `editions`: {problems}")
    return config


def plan(config: dict, preset: str, dev: Device, only: tuple[str, ...] | None = None) -> list[Job]:
    """Every job the run plans (`only`: these stages' jobs, as `stages=[...]` runs them)."""
    jobs = []
    for stage, estimate in ESTIMATES.items():
        if only is not None and stage not in only:
            continue
        if stage == "flash":
            estimate = partial(_flash, shared_cache="kernel_tests" in config)
        if stage in config and preset in config[stage]:
            jobs += estimate(config[stage][preset], dev, config.get("edition", DEFAULT_EDITION))
    stages = [s for s in ESTIMATES if s in config and (only is None or s in only)]
    jobs.append(Job("(local)", "aggregates, plots, report", LOCAL_JOB_S * 2 * len(stages),
                    f"about {2 * len(stages)} short jobs"))  # fmt: skip
    return jobs


def check(jobs: list[Job], dev: Device) -> str:
    """'' when the jobs fit the device's budget, else why not."""
    total = sum(j.seconds for j in jobs) / dev.parallel
    if total <= dev.budget_s:
        return ""
    worst = sorted(jobs, key=lambda j: -j.seconds)[:3]
    return (
        f"estimated {total / 60:.1f} min, above the budget of {dev.budget_s / 60:.0f} min on "
        f"{dev.name}; the longest: "
        + "; ".join(f"{j.stage} {j.job} {j.seconds:.0f} s" for j in worst)
    )
