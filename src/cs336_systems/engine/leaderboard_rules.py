"""The leaderboard's rules as functions: the 10-minute budget of a whole benchmark and the
breakdown of one profiled step into attention, matmuls, loss, optimizer and communication."""

from __future__ import annotations

import re

# triton.testing.do_bench(train_step, warmup=10_000, rep=30_000): milliseconds of each phase
BENCH_WARMUP_MS = 10_000
BENCH_REP_MS = 30_000
BUDGET_S = 600.0


def benchmark_seconds(
    setup_s: float, step_ms: float, warmup_ms: float = BENCH_WARMUP_MS, rep_ms: float = BENCH_REP_MS
) -> float:
    """Wall seconds of the whole benchmark from empty caches: building and compiling the model
    and the first steps (`setup_s`), then do_bench's warm-up and repetitions, each at least
    one step (do_bench runs whole steps: max(ms budget, one step))."""
    if step_ms <= 0:
        raise ValueError(f"step_ms must be positive, got {step_ms}")
    return setup_s + (max(warmup_ms, step_ms) + max(rep_ms, step_ms)) / 1e3


def fits_budget(setup_s: float, step_ms: float, budget_s: float = BUDGET_S) -> bool:
    return benchmark_seconds(setup_s, step_ms) <= budget_s


PARTS = ("attention", "matmul", "loss", "optimizer", "communication", "other")
# first match wins: communication and the loss before the matmuls they contain by name, the
# loss's log-softmax (aten::_log_softmax, LogSoftmaxBackward0, CUDA's cunn_SoftMaxForward<...,
# LogSoftMaxForwardEpilogue>) before attention's softmax
_RULES = [
    ("communication", r"nccl|gloo|all_?gather|reduce_?scatter|all_?reduce|broadcast|c10d"),
    ("loss", r"_LinearCrossEntropy|logsumexp|cross_entropy|nll_loss|log_?softmax"),
    ("optimizer", r"adam|Optimizer\.step|_foreach_|multi_tensor"),
    (
        "attention",
        r"flash|attention|attn|_fwd_kernel|_bwd_kernel|softmax|fmha|_FlashAttention",
    ),
    ("matmul", r"\b(aten::)?(mm|addmm|bmm|matmul|linear)\b|gemm|cutlass|nvjet|sm90_xmma|cublas"),
]
_COMPILED = [(part, re.compile(rx, re.IGNORECASE)) for part, rx in _RULES]


def classify(name: str) -> str:
    """The part of a step an operator or kernel belongs to (PARTS); by name."""
    for part, rx in _COMPILED:
        if rx.search(name):
            return part
    return "other"


def breakdown(events: list[tuple[str, float]]) -> dict[str, float]:
    """{part: summed time} over (name, self time) pairs, every part present."""
    out = dict.fromkeys(PARTS, 0.0)
    for name, t in events:
        out[classify(name)] += t
    return out
