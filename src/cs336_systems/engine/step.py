"""The training-step engine: one step (forward, loss, backward, AdamW) of a TransformerLM, built
for speed on the device it runs on, with the same inputs, outputs and update as the plain model.

    engine = Engine.build(model, tokens, targets, EngineOptions(precision="bf16"))
    loss = engine.step()

What it changes against the plain step (core/workload.py: the model's logits, F.cross_entropy,
AdamW):

- attention: our Triton FlashAttention-2 (`flash_triton`) on CUDA, `sdpa` on the CPU (`auto`);
- loss: engine/fused_ce.py, the LM head and cross-entropy chunked over tokens (no b n V
  logits); the model's head weight is the same Parameter (`LossHead` takes it over);
- optimizer: AdamW on the fp32 master weights, fused on CUDA, foreach on the CPU; compute in
  bf16 under autocast (`precision`); with `master_weights` (default on one CUDA device under
  bf16) every Linear weight (blocks and LM head) becomes a bf16 leaf the matmuls use as is (no
  autocast cast, a bf16 .grad) and engine/master_adamw.py keeps its fp32 master, updated with
  AdamW's moments and re-cast to the bf16 copy in one Triton pass per tensor;
- activation checkpointing: `auto` picks it by engine/memory_model.py against the memory this
  process can use (the least recomputation that fits: whole blocks, or only their FFN half,
  ``mixed_p<P>_f<F>``, with `selective`), or a named strategy (core/checkpoint_plans.py); on CUDA
  the first step then measures what one block saves under each arrangement and the step's
  peak, and the choice is made again from those measurements (`calibration`);
- compile: each block's ``forward`` compiled in place (names unchanged) when `compile` (the
  module's hooks, FSDP's gathers, stay outside the compiled code);
- world > 1 (torch.distributed initialized): FSDP (parallel/fsdp.py, bf16 compute, units of a
  block by default, `fsdp_units`; prefetch one unit ahead of a checkpointed segment, or none
  without `prefetch`) or DDP with the sharded optimizer (`parallel: ddp_sharded`), the batch
  being each rank's own.

The options that turn an optimization off (`attention="sdpa"`, `loss="plain"`,
`fsdp_units="layer"`, `prefetch=False`, a fixed `checkpoint`, `selective=False`) exist for the
leaderboard's ablation: each row is the engine with one of them changed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from cs336_systems.core import checkpoint_plans
from cs336_systems.core.device import autocast, free_memory_mib
from cs336_systems.engine import memory_model
from cs336_systems.engine.fused_ce import chunk_for, linear_cross_entropy
from cs336_systems.engine.master_adamw import MasterAdamW
from cs336_systems.kernels.attention import attention_function

PARALLEL = ("fsdp", "ddp_sharded")
LOSSES = ("fused", "plain")


@dataclass(frozen=True)
class EngineOptions:
    attention: str = "auto"
    precision: str = "bf16"
    checkpoint: str = "auto"
    compile: bool = False
    loss_chunk: int | None = None  # tokens per chunk of the fused loss (default: ~512 MiB fp32)
    parallel: str = "fsdp"
    lr: float = 1e-4
    weight_decay: float = 0.01
    free_bytes: float | None = None  # memory the step may use (default: this process's share)
    master_weights: bool | None = None  # bf16 Linear weights + fp32 masters (None: auto)
    loss: str = "fused"  # fused: engine/fused_ce.py; plain: full logits and F.cross_entropy
    fsdp_units: str = "block"  # FSDP's units: a block, or each layer (parallel/fsdp.py)
    prefetch: bool = True  # FSDP gathers ahead (False: each one when its unit runs)
    selective: bool = True  # `auto` may checkpoint FFN halves only (mixed_p<P>_f<F>)
    calibrate: bool = True  # `auto` on CUDA: choose again from the first step's measurements


def resolve_master_weights(opts: EngineOptions, device: torch.device, world: int) -> bool:
    """`master_weights` as given, or by default on for bf16 on one CUDA device; refused where
    it cannot apply (fp32 compute; FSDP/DDP, which keep their own fp32 parameters)."""
    if opts.master_weights is None:
        return device.type == "cuda" and opts.precision == "bf16" and world == 1
    if opts.master_weights and (opts.precision != "bf16" or world != 1):
        raise ValueError(
            f"master_weights needs precision bf16 on one process, got {opts.precision!r}, "
            f"world {world}"
        )
    return opts.master_weights


def to_working_bf16(lm: nn.Module) -> list[tuple[nn.Parameter, torch.Tensor]]:
    """Replace the weight of every nn.Linear of `lm` (the blocks' projections and the LM head)
    by a bf16 leaf Parameter; return (bf16 parameter, its fp32 master: the former weight)."""
    pairs = []
    for module in lm.modules():
        if isinstance(module, nn.Linear):
            master = module.weight.detach()
            module.weight = nn.Parameter(master.to(torch.bfloat16))
            pairs.append((module.weight, master))
    return pairs


def resolve_attention(name: str, device: torch.device) -> str:
    """`auto` before measuring: our FlashAttention-2 on CUDA, SDPA on the CPU."""
    if name == "auto":
        return "flash_triton" if device.type == "cuda" else "sdpa"
    return name


ATTENTION_CANDIDATES = ("flash_triton", "sdpa_cudnn")


def fastest_attention(s: memory_model.StepShape, device: torch.device) -> dict:
    """`auto` on CUDA: our FlashAttention-2 and SDPA's cuDNN backend at this step's attention
    (the rank's batch, heads, context and head dim, causal, the compute dtype), each output and
    query gradient checked against the other's, forward + backward timed back to back
    (triton.testing.do_bench, median ms); the faster one that ran and agreed."""
    import triton

    b, h, n, d = s.batch, s.num_heads, s.seq, s.d_model // s.num_heads
    dtype = torch.bfloat16 if s.precision == "bf16" else torch.float32
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (
        torch.randn(b, h, n, d, device=device, dtype=dtype, generator=gen).requires_grad_()
        for _ in range(3)
    )
    grad = torch.randn(b, h, n, d, device=device, dtype=dtype, generator=gen)
    times: dict[str, float] = {}
    outs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    notes: list[str] = []
    for name in ATTENTION_CANDIDATES:
        fn = attention_function(name)
        try:
            o = fn(q, k, v, is_causal=True)
            o.backward(grad)
            outs[name] = (o.detach().float(), q.grad.float())
            q.grad = k.grad = v.grad = None

            def fwd_bwd(fn=fn):
                fn(q, k, v, is_causal=True).backward(grad)

            times[name] = float(triton.testing.do_bench(fwd_bwd, warmup=50, rep=300))
            q.grad = k.grad = v.grad = None
        except Exception as exc:  # cuDNN refuses the dtype or the shape: ours stays
            notes.append(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}")
    chosen = "flash_triton"
    if "sdpa_cudnn" in outs and "flash_triton" in outs:
        o_ours, g_ours = outs["flash_triton"]
        o_peer, g_peer = outs["sdpa_cudnn"]
        diff = max(
            ((o_ours - o_peer).abs().max() / o_ours.abs().max()).item(),
            ((g_ours - g_peer).abs().max() / g_ours.abs().max()).item(),
        )
        agree = diff < 2e-2  # bf16's rounding of values of order one: about 1e-2 at most
        if not agree:
            notes.append(f"sdpa_cudnn differs from ours by {diff:.3g} (relative): not used")
        elif times["sdpa_cudnn"] < times["flash_triton"]:
            chosen = "sdpa_cudnn"
    return {"chosen": chosen, "ms": times, "notes": notes}


class LossHead(nn.Module):
    """The LM head as a loss: ``head(hidden, targets)`` is the mean cross-entropy of
    ``hidden @ weight.T`` (fused and chunked, or with `fused` False the full logits and
    F.cross_entropy). A module, so FSDP gathers its weight around it."""

    def __init__(self, weight: nn.Parameter, chunk: int, fused: bool = True):
        super().__init__()
        self.weight = weight
        self.chunk = chunk
        self.fused = fused

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return linear_cross_entropy(hidden, self.weight, targets, chunk=self.chunk)
        logits = F.linear(hidden, self.weight)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


class TrainModule(nn.Module):
    """``(tokens, targets) -> loss`` of a TransformerLM whose head is a LossHead."""

    def __init__(self, lm: nn.Module, chunk: int, fused: bool = True):
        super().__init__()
        lm.lm_head = LossHead(lm.lm_head.weight, chunk, fused)
        self.lm = lm

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        lm = self.lm
        x = lm.run_blocks(lm.layers, lm.token_embeddings(tokens))
        return lm.lm_head(lm.ln_final(x), targets)


def shape_of(
    lm: nn.Module, batch: int, seq: int, opts: EngineOptions, device: torch.device, world: int
) -> memory_model.StepShape:
    attn = lm.layers[0].attn
    return memory_model.StepShape(
        vocab_size=lm.vocab_size,
        d_model=lm.ln_final.weight.numel(),
        d_ff=lm.layers[0].ffn.w1.weight.shape[0],
        num_layers=len(lm.layers),
        num_heads=attn.num_heads,
        batch=batch,
        seq=seq,
        precision=opts.precision,
        attention=resolve_attention(opts.attention, device),
        device_type=device.type,
        world=world,
        scheme="single"
        if world == 1
        else ("fsdp" if opts.parallel == "fsdp" else "sharded_optimizer"),
    )


def capacity_bytes(device: torch.device) -> float:
    """Memory this process can use on `device`: what it holds plus what is free (so the same
    before and after FSDP frees the unsharded model); the host's available memory on a CPU."""
    free = (free_memory_mib(device) or float("inf")) * 2**20
    if device.type == "cuda":
        free += torch.cuda.memory_allocated(device)
    return free


def fsdp_window(strategy: str, num_layers: int) -> int:
    """Units FSDP may hold at once: a checkpointed segment is recomputed whole before its
    backward, so one more than the largest segment prefetches the next (at least 2)."""
    plan = checkpoint_plans.plan_for(strategy, num_layers)
    sizes = [len(checkpoint_plans.blocks_of(item)) for item in plan if isinstance(item, tuple)]
    return max(2, max(sizes, default=0) + 1)


@dataclass
class Engine:
    net: nn.Module  # TrainModule, or its FSDP / DDP wrapper
    train: TrainModule
    optimizer: torch.optim.Optimizer
    tokens: torch.Tensor
    targets: torch.Tensor
    options: EngineOptions
    plan: dict = field(default_factory=dict)  # the checkpointing choice and its memory
    shape: memory_model.StepShape | None = None
    calibration: dict | None = None  # the first step's measurements (pending: {})

    @classmethod
    def build(
        cls,
        lm: nn.Module,
        tokens: torch.Tensor,
        targets: torch.Tensor,
        options: EngineOptions | None = None,
    ) -> Engine:
        """Take over `lm` (a TransformerLM on its device) for training steps on this batch."""
        opts = options or EngineOptions()
        if opts.parallel not in PARALLEL:
            raise ValueError(f"unknown parallel scheme {opts.parallel!r}; known: {PARALLEL}")
        if opts.loss not in LOSSES:
            raise ValueError(f"unknown loss {opts.loss!r}; known: {LOSSES}")
        device = tokens.device
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        chunk = opts.loss_chunk or chunk_for(lm.vocab_size)
        shape = shape_of(lm, tokens.shape[0], tokens.shape[1], opts, device, world)
        attention = {"chosen": resolve_attention(opts.attention, device), "ms": {}, "notes": []}
        if opts.attention == "auto" and device.type == "cuda":
            attention = fastest_attention(shape, device)
        lm.set_attention(attention_function(attention["chosen"]))
        master = resolve_master_weights(opts, device, world)
        shape = dataclasses.replace(shape, master_weights=master)
        working = to_working_bf16(lm) if master else []
        train = TrainModule(lm, chunk, fused=opts.loss == "fused")
        fused = device.type == "cuda"
        adamw = {"lr": opts.lr, "weight_decay": opts.weight_decay}
        adamw.update(fused=True) if fused else adamw.update(foreach=True)
        sharded = world > 1 and opts.parallel == "fsdp"
        if working:
            net: nn.Module = train
            ids = {id(w) for w, _ in working}
            rest = [p for p in train.parameters() if id(p) not in ids]
            optimizer = MasterAdamW(working, rest, lr=opts.lr, weight_decay=opts.weight_decay)
        elif world == 1:
            net = train
            optimizer = torch.optim.AdamW(train.parameters(), **adamw)
        elif sharded:
            from cs336_systems.parallel.fsdp import FSDP

            compute = torch.bfloat16 if opts.precision == "bf16" else None
            net = FSDP(train, compute_dtype=compute, units=opts.fsdp_units)
            optimizer = torch.optim.AdamW(net.parameters(), **adamw)
        else:
            from cs336_systems.parallel.ddp import wrap
            from cs336_systems.parallel.sharded_optimizer import ShardedOptimizer

            net = wrap(train, "overlap")
            optimizer = ShardedOptimizer(train.parameters(), torch.optim.AdamW, **adamw)
        # the budget once the model is in its final (sharded) form
        capacity = opts.free_bytes if opts.free_bytes is not None else capacity_bytes(device)
        if opts.checkpoint == "auto":
            plan = memory_model.choose_checkpointing(shape, capacity, chunk, opts.selective)
        else:
            plan = {**memory_model.step_bytes(shape, opts.checkpoint, chunk), "fits": True}
        plan = {**plan, "chunk": chunk, "master_weights": master, "capacity": capacity}
        plan["attention"] = attention
        if opts.compile:
            for block in lm.layers:  # forward only: hooks on the block stay eager
                block.forward = torch.compile(block.forward)
        engine = cls(net, train, optimizer, tokens, targets, opts, plan, shape)
        engine.use_strategy(plan["strategy"])
        calibrate = (
            opts.checkpoint == "auto"
            and opts.calibrate
            and opts.selective
            and device.type == "cuda"
            and shape.num_layers >= 3
        )
        if calibrate:
            engine.calibration = {}
        return engine

    def use_strategy(self, strategy: str) -> None:
        """Run the blocks under `strategy` from the next step on."""
        lm = self.train.lm
        checkpoint_plans.apply(lm, strategy)
        if hasattr(self.net, "window"):
            self.net.window = fsdp_window(strategy, len(lm.layers)) if self.options.prefetch else 1
        self.plan["strategy"] = strategy

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    def loss(self) -> torch.Tensor:
        with autocast(self.options.precision, self.device):
            return self.net(self.tokens, self.targets)

    def step(self, phase=None) -> torch.Tensor:
        """One training step; `phase(name)` (optional) is called at its boundaries: after
        forward, backward, communication and the optimizer (a StepClock's `mark`). The first
        step of a calibrating engine measures and re-plans (`calibrate`)."""
        if self.calibration == {}:
            return self._calibrate(phase)
        return self._step(phase)

    def _step(self, phase=None, before_optimizer=None) -> torch.Tensor:
        mark = phase or (lambda name: None)
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss()
        mark("forward")
        loss.backward()
        mark("backward")
        if hasattr(self.net, "finish_gradient_synchronization"):
            self.net.finish_gradient_synchronization()
        mark("comm")
        if before_optimizer is not None:
            before_optimizer()
        self.optimizer.step()
        mark("optimizer")
        return loss.detach()

    def _calibrate(self, phase=None) -> torch.Tensor:
        """One step under a probe arrangement (the last block plain, the one before it with its
        FFN half checkpointed, the rest checkpointed alone) that measures what a block saves in
        each arrangement (memory allocated across its forward, its output included) and the
        step's peak; then the least recomputation whose predicted peak fits (memory_model.py
        mixed_bytes on the measured bytes) is chosen for the next steps. Where the probe itself
        may not fit by the model, the model's choice stays."""
        from cs336_systems.core.checkpoint_plans import mixed_name

        probe = mixed_name(1, 1)
        budget = self.plan["capacity"] * (1 - memory_model.MARGIN)
        modelled = memory_model.step_bytes(self.shape, probe, self.plan["chunk"])["total"]
        if modelled > budget:
            self.calibration = {
                "skipped": f"the probe {probe} may not fit ({modelled / 1e9:.1f} GB)"
            }
            return self._step(phase)
        chosen = self.plan["strategy"]
        self.use_strategy(probe)
        loss, blk, peak, grown, slack = self._probe_step(phase)
        budget -= slack
        factor, predicted, best = self._least_recomputation(blk, peak + grown, budget, chosen)
        self.use_strategy(best)
        self.plan.update(compute_factor=factor)
        self.calibration = {
            "probe": probe,
            "model_choice": chosen,
            "block_plain_bytes": blk["plain"],
            "block_ffn_bytes": blk["ffn"],
            "block_input_bytes": blk["input"],
            "probe_peak_bytes": float(peak),
            "optimizer_state_bytes": grown,
            "predicted_peak_bytes": predicted,
            "allocator_slack_bytes": slack,
            "budget_bytes": budget,
            "choice": best,
        }
        return loss

    def _probe_step(self, phase=None) -> tuple[torch.Tensor, dict[str, float], int, float, float]:
        """The probe's step, measured: its loss, what each of the last three blocks saved
        (`plain`, `ffn`, `input`: memory allocated across its forward), the forward and
        backward's peak, the optimizer state the step created and the caching allocator's
        slack (reserved beyond allocated at the peaks)."""
        lm, dev = self.train.lm, self.device
        n = len(lm.layers)
        deltas: dict[str, float] = {}
        handles = self._block_hooks({n - 1: "plain", n - 2: "ffn", n - 3: "input"}, deltas)
        opt_mem: dict[str, float] = {}

        def before_optimizer():  # the forward and backward's peak, before AdamW's state exists
            opt_mem["before"] = torch.cuda.memory_allocated(dev)
            opt_mem["peak"] = torch.cuda.max_memory_allocated(dev)

        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        try:
            loss = self._step(phase, before_optimizer)
            torch.cuda.synchronize(dev)
        finally:
            for h in handles:
                h.remove()
        peak = opt_mem["peak"]
        # optimizer state created by this first step (AdamW's moments) is there in every later
        # step's forward and backward, not in this one's
        grown = max(0.0, torch.cuda.memory_allocated(dev) - opt_mem["before"])
        # what the caching allocator held beyond what was allocated (fragmentation) stays
        # unusable: the choice must leave it free too
        slack = max(0.0, torch.cuda.max_memory_reserved(dev) - torch.cuda.max_memory_allocated(dev))
        blk = {k: float(v) for k, v in deltas.items()}
        return loss, blk, peak, grown, slack

    def _block_hooks(self, kinds: dict[int, str], deltas: dict[str, float]) -> list:
        """Hooks on the blocks of `kinds` ({layer index: kind}) that put into `deltas[kind]`
        the memory allocated across the block's forward (not a recompute's), less FSDP's
        gathered weights (prefetch moves them); the handles, to remove them."""
        lm, dev = self.train.lm, self.device

        def held() -> float:  # allocated, less FSDP's gathered weights (prefetch moves them)
            return torch.cuda.memory_allocated(dev) - getattr(self.net, "resident_bytes", 0)

        handles = []
        for i, kind in kinds.items():

            def pre(m, args, kind=kind):
                if torch._C._current_graph_task_id() == -1:  # forward, not a recompute
                    deltas[kind] = -held()

            def post(m, args, out, kind=kind):
                if torch._C._current_graph_task_id() == -1:
                    deltas[kind] += held()

            handles += [
                lm.layers[i].register_forward_pre_hook(pre),
                lm.layers[i].register_forward_hook(post),
            ]
        return handles

    def _least_recomputation(
        self, blk: dict[str, float], measured: float, budget: float, chosen: str
    ) -> tuple[float, float, str]:
        """(compute factor, predicted peak, strategy) of the candidate with the least
        recomputation whose peak fits `budget`, predicted from the blocks' measured bytes `blk`
        and the probe step's `measured` peak (with the optimizer state it created); the model's
        `chosen` strategy where none fits."""
        s, n = self.shape, len(self.train.lm.layers)
        base = measured - memory_model.mixed_bytes(s, 1, 1, 0, blk)["peak_bytes"]
        rows = []
        for name in memory_model.candidates(n, selective=True):
            counts = checkpoint_plans.mixed_counts(name, n)
            if name == "none":
                counts = (n, 0)
            elif name == "every_1":
                counts = (0, 0)
            if counts is None:
                continue
            act = memory_model.mixed_bytes(s, *counts, 0, blk)
            rows.append((act["compute_factor"], base + act["peak_bytes"], name))
        fitting = [r for r in rows if r[1] <= budget]
        if fitting:
            return min(fitting)
        return self.plan["compute_factor"], float("nan"), chosen

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter of the model at full size, by the TransformerLM's own names (the
        fp32 masters of bf16 working weights)."""
        if hasattr(self.net, "gather_full_params"):
            full = self.net.gather_full_params()
        else:
            master = getattr(self.optimizer, "master", lambda p: p.detach())
            full = {n: master(p) for n, p in self.train.named_parameters()}
        return {n.removeprefix("lm."): t for n, t in full.items()}
