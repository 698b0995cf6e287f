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
- activation checkpointing: `auto` picks it by engine/memory.py against the device's free
  memory (the least recomputation that fits), or a named strategy (core/checkpointing.py);
- compile: each block ``nn.Module.compile()``'d in place (names unchanged) when `compile`;
- world > 1 (torch.distributed initialized): FSDP (parallel/fsdp.py, bf16 compute) or DDP with
  the sharded optimizer (`parallel: ddp_sharded`), the batch being each rank's own.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from cs336_systems.core import checkpointing
from cs336_systems.core.device import autocast, free_memory_mib
from cs336_systems.engine import memory
from cs336_systems.engine.fused_ce import chunk_for, linear_cross_entropy
from cs336_systems.engine.master_adamw import MasterAdamW
from cs336_systems.kernels.attention import attention_function

PARALLEL = ("fsdp", "ddp_sharded")


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
    free_bytes: float | None = None  # memory the checkpointing choice may use (default: free now)
    master_weights: bool | None = None  # bf16 Linear weights + fp32 masters (None: auto)


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
    if name == "auto":
        return "flash_triton" if device.type == "cuda" else "sdpa"
    return name


class LossHead(nn.Module):
    """The LM head as a loss: ``head(hidden, targets)`` is the mean cross-entropy of
    ``hidden @ weight.T`` (fused, chunked). A module, so FSDP gathers its weight around it."""

    def __init__(self, weight: nn.Parameter, chunk: int):
        super().__init__()
        self.weight = weight
        self.chunk = chunk

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return linear_cross_entropy(hidden, self.weight, targets, chunk=self.chunk)


class TrainModule(nn.Module):
    """``(tokens, targets) -> loss`` of a TransformerLM whose head is a LossHead."""

    def __init__(self, lm: nn.Module, chunk: int):
        super().__init__()
        lm.lm_head = LossHead(lm.lm_head.weight, chunk)
        self.lm = lm

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        lm = self.lm
        x = lm.run_blocks(lm.layers, lm.token_embeddings(tokens))
        return lm.lm_head(lm.ln_final(x), targets)


def shape_of(
    lm: nn.Module, batch: int, seq: int, opts: EngineOptions, device: torch.device, world: int
) -> memory.StepShape:
    attn = lm.layers[0].attn
    return memory.StepShape(
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


@dataclass
class Engine:
    net: nn.Module  # TrainModule, or its FSDP / DDP wrapper
    train: TrainModule
    optimizer: torch.optim.Optimizer
    tokens: torch.Tensor
    targets: torch.Tensor
    options: EngineOptions
    plan: dict = field(default_factory=dict)  # the checkpointing choice and its memory

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
        device = tokens.device
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        lm.set_attention(attention_function(resolve_attention(opts.attention, device)))
        chunk = opts.loss_chunk or chunk_for(lm.vocab_size)
        shape = shape_of(lm, tokens.shape[0], tokens.shape[1], opts, device, world)
        master = resolve_master_weights(opts, device, world)
        shape = dataclasses.replace(shape, master_weights=master)
        if opts.checkpoint == "auto":
            free = opts.free_bytes
            if free is None:
                free = (free_memory_mib(device) or float("inf")) * 2**20
            plan = memory.choose_checkpointing(shape, free, chunk)
        else:
            plan = {**memory.step_bytes(shape, opts.checkpoint, chunk), "fits": True}
        checkpointing.apply(lm, plan["strategy"])
        working = to_working_bf16(lm) if master else []
        if opts.compile:
            for block in lm.layers:
                block.compile()
        train = TrainModule(lm, chunk)
        fused = device.type == "cuda"
        adamw = {"lr": opts.lr, "weight_decay": opts.weight_decay}
        adamw.update(fused=True) if fused else adamw.update(foreach=True)
        if working:
            net: nn.Module = train
            ids = {id(w) for w, _ in working}
            rest = [p for p in train.parameters() if id(p) not in ids]
            optimizer = MasterAdamW(working, rest, lr=opts.lr, weight_decay=opts.weight_decay)
        elif world == 1:
            net = train
            optimizer = torch.optim.AdamW(train.parameters(), **adamw)
        elif opts.parallel == "fsdp":
            from cs336_systems.parallel.fsdp import FSDP

            compute = torch.bfloat16 if opts.precision == "bf16" else None
            net = FSDP(train, compute_dtype=compute)
            optimizer = torch.optim.AdamW(net.parameters(), **adamw)
        else:
            from cs336_systems.parallel.ddp import wrap
            from cs336_systems.parallel.sharded_optimizer import ShardedOptimizer

            net = wrap(train, "overlap")
            optimizer = ShardedOptimizer(train.parameters(), torch.optim.AdamW, **adamw)
        plan = {**plan, "chunk": chunk, "master_weights": master}
        return cls(net, train, optimizer, tokens, targets, opts, plan)

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    def loss(self) -> torch.Tensor:
        with autocast(self.options.precision, self.device):
            return self.net(self.tokens, self.targets)

    def step(self, phase=None) -> torch.Tensor:
        """One training step; `phase(name)` (optional) is called at its boundaries: after
        forward, backward, communication and the optimizer (a StepClock's `mark`)."""
        mark = phase or (lambda name: None)
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss()
        mark("forward")
        loss.backward()
        mark("backward")
        if hasattr(self.net, "finish_gradient_synchronization"):
            self.net.finish_gradient_synchronization()
        mark("comm")
        self.optimizer.step()
        mark("optimizer")
        return loss.detach()

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter of the model at full size, by the TransformerLM's own names (the
        fp32 masters of bf16 working weights)."""
        if hasattr(self.net, "gather_full_params"):
            full = self.net.gather_full_params()
        else:
            master = getattr(self.optimizer, "master", lambda p: p.detach())
            full = {n: master(p) for n, p in self.train.named_parameters()}
        return {n.removeprefix("lm."): t for n, t in full.items()}
