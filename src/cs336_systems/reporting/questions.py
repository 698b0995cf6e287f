"""The questions the study answers, part by part, from the course's two handouts (Stanford CS336
assignment 2, "Systems": spring 2025, version 1.0.4; spring 2026, version 26.1.1).

`PARTS` is the list: one entry per lettered part of each problem (a problem without letters is
one part), what it asks in a line, the form of its deliverable, which edition asks it, and the
report's answer (`Q<n>`, the heading of the section that answers it). `kind` says what the part
is: `written` (a number, table, plot or sentences the report gives), `code` (an implementation:
where it lives, which tests check it: `tests`, the files, and `match`, a regex on
`file::test name`), `optional` (asked outside a problem box) or `ours` (a question the study
adds beside the handout's). The handout's own count of parts is its `written` and `code` parts
(HANDOUT_KINDS): 2025 43 (34 + 9), 2026 58 (49 + 9), verified against the course's PDFs. Which stage answers a part, and how the report tells, is each stage's `QUESTIONS`
declaration (its package's `__init__.py`, read here as data); reporting/coverage.py turns both into
the report's coverage table.

    python -m cs336_systems.reporting.questions --out docs/questions.md   # the readable list

Standard library only: the workflow and the report read it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cs336_systems.planning.imports import module_literal

SRC = Path(__file__).resolve().parents[2]
STAGES = SRC / "cs336_systems" / "stages"
BOTH = ("2025", "2026")
EDITIONS = BOTH
Y2025 = ("2025",)
Y2026 = ("2026",)

# The project's answers (the report's headings `Q<n>`): number -> title. Each part below names
# the answer it is given in; one answer may serve several parts.
ANSWERS: dict[int, str] = {
    1: "Forward, backward and optimizer-step latency",
    2: "Warm-up",
    3: "bf16 autocast and torch.compile",
    4: "Achieved TFLOP/s and MFU",
    5: "Forward time under the profiler vs the harness",
    6: "The kernel that takes the most time",
    7: "Non-matmul kernels in forward",
    8: "GEMM share: forward vs training step",
    9: "Softmax vs matmuls inside attention",
    10: "Accumulating 0.01 a thousand times",
    11: "Autocast dtypes of the toy model",
    12: "Layer normalization in low precision",
    13: "Memory timelines",
    14: "Peak memory per context length",
    15: "Mixed precision and peak memory",
    16: "Activation sizes: derived and measured",
    17: "The largest allocations",
    18: "Attention: time, memory, and what runs out of memory",
    19: "torch.compile",
    20: "Our Triton kernel against PyTorch",
    21: "The FlashAttention leaderboard configuration",
    22: "All-reduce time and bandwidth",
    23: "Naive DDP",
    24: "One flattened all-reduce",
    25: "Overlapping communication with backward",
    26: "Bucketed all-reduce and the bucket-size model",
    27: "Optimizer-state sharding",
    28: "One TransformerBlock: what it saves for backward, and its gradients",
    29: "What autograd saves: one RMSNorm and one TransformerBlock",
    30: "The memory-optimal arrangement with nesting",
    31: "One level of checkpointing: the best block size",
    32: "FSDP's memory saving",
    33: "FSDP on two GPUs: the all-gather in time",
    34: "The alternate ring all-reduce",
    35: "Data-, fully sharded- and tensor-parallel FFN",
    36: "2-D FSDP x TP",
    37: "The 8B full-step leaderboard",
    38: "Communication accounting of the XXL model",
}


def _p(pid, editions, kind, deliverable, ask, answer=None, **extra) -> dict:
    problem, _, letter = pid.partition(".")
    return {
        "id": pid,
        "problem": problem,
        "part": letter,
        "editions": editions,
        "kind": kind,
        "deliverable": deliverable,
        "ask": ask,
        "answer": answer,
        **extra,
    }


# (section of the 2025 handout / of the 2026 handout) per problem, for the readable list
SECTIONS = {
    "benchmarking_script": "1.1.3 / 2.1.3",
    "nsys_profile": "1.1.4 / 2.1.4",
    "mixed_precision_accumulation": "1.1.5 / 2.1.5",
    "benchmarking_mixed_precision": "1.1.5 / 2.1.5",
    "memory_profiling": "1.1.6 / 2.1.6",
    "gradient_checkpointing": "– / 3",
    "pytorch_attention": "1.2.1 / 4.1.1",
    "torch_compile": "1.3 / 4.2",
    "flash_forward": "1.3.2 / 4.2.2",
    "flash_backward": "1.3.2 / 4.2.2",
    "flash_benchmarking": "1.3.2 / 4.2.2",
    "flash_leaderboard": "1.3.3 / –",
    "distributed_communication_single_node": "2.1 / 5.1",
    "naive_ddp": "2.2 / 5.2",
    "naive_ddp_benchmarking": "2.2 / 5.2",
    "minimal_ddp_flat_benchmarking": "2.3.1 / 5.3.1",
    "ddp_overlap_individual_parameters": "2.3.2 / 5.3.2",
    "ddp_overlap_individual_parameters_benchmarking": "2.3.2 / 5.3.2",
    "ddp_overlap_bucketed": "2.3.3 / –",
    "ddp_bucketed_benchmarking": "2.3.3 / –",
    "communication_accounting": "2.4 / –",
    "optimizer_state_sharding": "3 / 6",
    "optimizer_state_sharding_accounting": "3 / 6",
    "fsdp": "– / 7",
    "fsdp_accounting": "– / 7",
    "alternate_ring_all_reduce": "– / 8.1",
    "data_parallel_calcs": "– / 8.2",
    "fsdp_calcs": "– / 8.3",
    "tp_calcs": "– / 8.4",
    "fsdp_tp_calcs": "– / 8.5",
    "leaderboard": "– / 9",
    "ours": "(the study's own)",
}

# fmt: off
PARTS: list[dict] = [
    _p("benchmarking_script.a", BOTH, "code", "a script",
       "A script that builds the model from hyperparameters, makes a random batch, runs w warm-up "
       "steps and times n steps (forward; forward and backward; 2026: also the optimizer step), "
       "synchronizing after each.",
       code="src/cs336_systems/stages/benchmark/measure.py, core/harness.py",
       tests="tests/unit/core/test_harness.py, tests/stages/benchmark/test_benchmark.py"),
    _p("benchmarking_script.b", BOTH, "written", "1-2 sentences with the timings",
       "Every size of the edition's table, 5 warm-up and 10 measured steps, mean and std: how long "
       "a forward and a backward (2026: and the optimizer step) take; is the std small?", answer=1),
    _p("benchmarking_script.c", BOTH, "written", "2-3 sentences",
       "The same without warm-up, and with 1 or 2 warm-up steps: what changes, why, and why 1-2 "
       "warm-ups may still differ.", answer=2),
    _p("nsys_profile.a", BOTH, "written", "1-2 sentences",
       "Profile forward, backward and the optimizer step (2025: every size at contexts 128, 256, "
       "512, 1024; 2026: two sizes at three power-of-two contexts above 128, the largest the "
       "longest that fits). The total forward time: does it match the Python timing?", answer=5),
    _p("nsys_profile.b", BOTH, "written", "1-2 sentences",
       "The CUDA kernel with the most GPU time in forward, its calls per forward; is it the same "
       "with forward and backward?", answer=6),
    _p("nsys_profile.c", BOTH, "written", "1-2 sentences",
       "Which kernels besides matmuls take a non-trivial share of forward time?", answer=7),
    _p("nsys_profile.d", BOTH, "written", "1-2 sentences",
       "A whole training step with AdamW: how does the matmul share of time change against "
       "inference (forward only)? How about the other kernels?", answer=8),
    _p("nsys_profile.e", BOTH, "written", "1-2 sentences",
       "Inside self-attention in forward: softmax runtime against the matmuls', compared with "
       "their difference in FLOPs.", answer=9),
    _p("mixed_precision_accumulation", BOTH, "written", "2-3 sentences",
       "Sum 0.01 a thousand times in fp32, fp16, and fp16 addends into fp32 (implicit and explicit "
       "cast): comment on the accuracy.", answer=10),
    _p("benchmarking_mixed_precision.a", BOTH, "written", "the data types",
       "Under fp16 autocast, the dtypes of the toy model's parameters, fc1 output, LayerNorm "
       "output, logits, loss and gradients.", answer=11),
    _p("benchmarking_mixed_precision.b", BOTH, "written", "2-3 sentences",
       "Which parts of layer normalization are sensitive to mixed precision; with bf16, must it "
       "still be treated differently?", answer=12),
    _p("benchmarking_mixed_precision.c", BOTH, "written", "2-3 sentences with timings",
       "Forward and backward with and without bf16 autocast for every size: compare, and the trend "
       "as the model grows.", answer=3),
    _p("memory_profiling.a", BOTH, "written", "two timeline images and 2-3 sentences",
       "Memory timelines (2025: the 2.7B at contexts 128, 256, 512; 2026: xl at 128 and 2048) of a "
       "forward and of a training step: what do they look like, can the stages be told from the "
       "peaks?", answer=13),
    _p("memory_profiling.b", BOTH, "written", "a table, two numbers per context",
       "Peak memory per context length: forward, and a full training step.", answer=14),
    _p("memory_profiling.c", BOTH, "written", "2-3 sentences",
       "Peak memory with mixed precision, forward and training step: does it change much?",
       answer=15),
    _p("memory_profiling.d", BOTH, "written", "1-2 sentences with the derivation",
       "The size of one residual-stream activation in fp32 at the reference hyperparameters, in "
       "MiB.", answer=16),
    _p("memory_profiling.e", BOTH, "written", "1-2 sentences",
       "In the forward pass's timeline, the largest allocations: their size, and where they come "
       "from by their stack traces.", answer=17),
    _p("memory_profiling.f", Y2026, "written", "Nsight screenshots and 1-2 paragraphs",
       "What one TransformerBlock saves for backward (the 5 largest contributing ops and their "
       "share), and from the backward's memory changes, the size of one block's gradients: as "
       "expected?", answer=28),
    _p("ours.saved_tensors", Y2026, "ours", "a table per module",
       "The tensors autograd saves for one RMSNorm and one xl TransformerBlock at (4, 2048, 2560), "
       "eager and compiled (the handout's section 3.1 walk-through, measured).", answer=29),
    _p("gradient_checkpointing.a", Y2026, "written", "3-5 sentences and a code sketch",
       "With nesting allowed and compute ignored, the checkpointing arrangement that minimizes "
       "peak activation memory, its asymptotic memory and compute in N blocks.", answer=30),
    _p("gradient_checkpointing.b", Y2026, "written", "3-5 sentences and the measured peak",
       "xl, batch 4, sequence 2048, one level of checkpointing: the best block size, its measured "
       "peak, and the peaks of the next smaller and larger sizes.", answer=31),
    _p("pytorch_attention.a", BOTH, "written",
       "a table of timings, the memory accounting and 1-2 paragraphs",
       "Batch 8, one head, d in {16, 32, 64, 128} x n in {256, 1024, 4096, 8192, 16384}: 100 "
       "forward and 100 backward passes, memory before backward; which sizes run out of memory, "
       "the accounting of the smallest, how saved memory grows with n, how to remove it.",
       answer=18),
    _p("torch_compile.a", BOTH, "written", "a table, compiled against eager attention",
       "The compiled attention against the uncompiled one on the same grid: forward and backward "
       "times.", answer=19),
    _p("torch_compile.b", BOTH, "written", "a table, compiled against eager model",
       "The whole model compiled: how forward changes; forward and backward with the optimizer "
       "step.", answer=19),
    _p("ours.mfu", BOTH, "ours", "a table and a sentence",
       "Achieved TFLOP/s and MFU against this machine's measured matmul peak.", answer=4),
    _p("flash_forward.a", BOTH, "code", "an autograd.Function (PyTorch, tiled)",
       "FlashAttention-2's forward in pure PyTorch, tiles at least 16 x 16, saving L, Q, K, V, O.",
       code="src/cs336_systems/kernels/flash_pytorch.py", tests="tests/unit/kernels/test_flash_attention.py",
       match=r"::test_pytorch_(forward|rejects|saves_l|tile_sizes)"),
    _p("flash_forward.b", BOTH, "code", "an autograd.Function (Triton)",
       "The forward as one Triton kernel, launch grid (Tq, batch), one loop over key tiles.",
       code="src/cs336_systems/kernels/flash_triton*.py", tests="tests/unit/kernels/test_flash_attention.py",
       match=r"::test_(triton_(forward|rejects|tile_shapes|multihead|descriptor)|hopper_forward)"),
    _p("flash_forward.c", BOTH, "code", "a causal flag",
       "A causal-masking flag (default False), is_causal a tl.constexpr, -1e6 on masked scores.",
       code="src/cs336_systems/kernels/triton/forward.py",
       tests="tests/unit/kernels/test_flash_attention.py",
       match=r"::test_(causal_convention|triton_forward\[.*causal)"),
    _p("flash_backward", BOTH, "code", "a backward pass (PyTorch + torch.compile)",
       "The backward from Q, K, V, O, dO and L, with the D vector, recomputing P.",
       code="src/cs336_systems/kernels/flash_pytorch.py, kernels/triton/backward.py",
       tests="tests/unit/kernels/test_flash_attention.py",
       match=r"::test_(pytorch_backward|triton_backward|triton_sum_backward|hopper_(dq|fused_dq|ws_dkdv))"),
    _p("flash_benchmarking.a", BOTH, "written",
       "a table: forward, backward and forward+backward latencies",
       "With triton.testing.do_bench, batch 1, causal: our Triton FlashAttention-2 against PyTorch "
       "attention over n = 128 ... 65536, d = 16 ... 128, bf16 and fp32.", answer=20),
    _p("flash_leaderboard", Y2025, "optional", "the timing of the leaderboard's test",
       "Forward and backward of the FlashAttention-2 leaderboard's test: batch 1, 16 heads, n = "
       "16384, d_head 64, bf16, causal (section 1.3.3, no problem box).", answer=21),
    _p("ours.flash_leaderboard", Y2026, "ours", "a table",
       "The 2025 FlashAttention leaderboard's configuration (B 1, 16 heads, n 16384, d 64, bf16, "
       "causal): ours beside SDPA flash and cuDNN.", answer=21),
    _p("distributed_communication_single_node", BOTH, "written",
       "plot(s) and/or table(s) and 2-3 sentences",
       "All-reduce time over 1 MiB ... 1 GiB of fp32 (the handout writes MB, GB) and 2, 4, 6 "
       "processes (2025: gloo on CPU and NCCL on GPU; 2026: NCCL): how the factors interact.",
       answer=22),
    _p("naive_ddp", BOTH, "code", "a script",
       "DDP by all-reducing each parameter's gradient after backward; weights match single-process "
       "training on a toy model.",
       code="src/cs336_systems/parallel/ddp.py", tests="tests/stages/ddp/test_ddp.py",
       match=r"::test_ddp_matches_single_process\[naive"),
    _p("naive_ddp_benchmarking", BOTH, "written",
       "the setup, the time per step and the time communicating",
       "Naive DDP on 1 node x 2 GPUs with the edition's xl: time per step and the share spent "
       "communicating gradients.", answer=23),
    _p("minimal_ddp_flat_benchmarking", BOTH, "written", "the times and 1-2 sentences",
       "One all-reduce of the flattened gradients against one per parameter: time per step and "
       "communication time.", answer=24),
    _p("ddp_overlap_individual_parameters", BOTH, "code", "a DDP class",
       "DDP that all-reduces each parameter's gradient asynchronously as it is ready (post-"
       "accumulate-grad hooks).",
       code="src/cs336_systems/parallel/ddp.py",
       tests="tests/stages/ddp/test_ddp.py, tests/unit/adapters/test_adapters.py",
       match=r"::test_(ddp_matches_single_process\[overlap|a_weight_accumulated_twice_is_averaged_once"
             r"\[overlap|get_ddp_matches_single_process|a_dropped_wrapper_frees_its_model\[overlap)"),
    _p("ddp_overlap_individual_parameters_benchmarking.a", BOTH, "written",
       "the time per step and 1-2 sentences",
       "The overlapping DDP against naive and flat: time per training step.", answer=25),
    _p("ddp_overlap_individual_parameters_benchmarking.b", BOTH, "written", "2 screenshots",
       "Profiles showing that one implementation overlaps compute with communication and the other "
       "does not.", answer=25),
    _p("ddp_overlap_bucketed", Y2025, "code", "a bucketed DDP class",
       "DDP with gradients bucketed (bucket_size_mb), each bucket all-reduced when ready.",
       code="src/cs336_systems/parallel/ddp.py", tests="tests/stages/ddp/test_ddp.py",
       match=r"::test_(ddp_matches_single_process\[bucketed|bucket_layout|bucket_order"
             r"|a_weight_accumulated_twice_is_averaged_once\[bucketed|a_dropped_wrapper_frees_its_model\[bucketed)"),
    _p("ddp_bucketed_benchmarking.a", Y2025, "written",
       "the time per step per bucket size and 3-4 sentences",
       "Bucket sizes 1, 10, 100, 1000 MiB (bucket_size_mb): time per step against the "
       "unbucketed variants; as expected? If not, why, and what setup would match.", answer=26),
    _p("ddp_bucketed_benchmarking.b", Y2025, "written", "two equations",
       "DDP's overhead in s (bytes), w (bandwidth), o (per-call overhead) and n_b (buckets), and "
       "the bucket size that minimizes it.", answer=26),
    _p("communication_accounting.a", Y2025, "written", "the calculation and one sentence",
       "The XXL model (d_model 16384, d_ff 53248, 126 blocks of two linears): fp32 master weights, "
       "accumulated gradients and optimizer state on one device; the bf16 activations saved for "
       "backward; in H100-80GB equivalents.", answer=38),
    _p("communication_accounting.b", Y2025, "written", "an expression and one sentence",
       "Weights, optimizer state, gradients and half the activations sharded over N_FSDP devices: "
       "memory per device, and the N_FSDP that fits a 95 GB TPU v5p.", answer=38),
    _p("communication_accounting.c", Y2025, "written", "the calculation and one sentence",
       "Forward only, W_ici = 2 x 9e10 B/s, C = 4.6e14 FLOP/s, a 16 x 4 mesh (X = 16 FSDP, Y = 4 "
       "TP, M_X = 2, M_Y = 1): the per-device batch at which it is compute-bound, and the overall "
       "batch.", answer=38),
    _p("communication_accounting.d", Y2025, "written", "one paragraph with references or equations",
       "Tricks that reduce the batch size while staying compute-bound.", answer=38),
    _p("optimizer_state_sharding", BOTH, "code", "a sharded optimizer class",
       "An optimizer wrapper that keeps each parameter's state on one rank and broadcasts the "
       "updated parameters.",
       code="src/cs336_systems/parallel/sharded_optimizer.py",
       tests="tests/unit/parallel/test_sharded_optimizer.py, tests/unit/adapters/test_adapters.py",
       match=r"test_sharded_optimizer\.py::|::test_get_sharded_optimizer"),
    _p("optimizer_state_sharding_accounting.a", BOTH, "written",
       "2-3 sentences with the peaks and their breakdown",
       "Peak memory after construction, before and after the optimizer step, with and without "
       "sharding (1 node x 2 GPUs, xl), broken down into parameters, optimizer state, ...",
       answer=27),
    _p("optimizer_state_sharding_accounting.b", BOTH, "written", "2-3 sentences with timings",
       "Time per step with and without sharding.", answer=27),
    _p("optimizer_state_sharding_accounting.c", BOTH, "written", "2-3 sentences",
       "How this sharding differs from ZeRO stage 1 (memory and communication volume).", answer=27),
    _p("fsdp", Y2026, "code", "an FSDP class",
       "FSDP over Linear and Embedding weights: all-gather before use (prefetch bounded), free "
       "after, reduce-scatter gradients, optional compute dtype, fp32 master weights.",
       code="src/cs336_systems/parallel/fsdp.py", tests="tests/unit/parallel/test_fsdp.py"),
    _p("fsdp_accounting.a", Y2026, "written", "2-3 sentences",
       "The memory FSDP should save from the peak against optimizer-state sharding (all-gather "
       "buffers ignored).", answer=32),
    _p("fsdp_accounting.b", Y2026, "written", "2-3 sentences with timings and screenshots",
       "xl on two GPUs: does the weights' all-gather finish in time for the forward pass?",
       answer=33),
    _p("alternate_ring_all_reduce", Y2026, "written", "an expression in S, N, W and one sentence",
       "The time of the alternate ring all-reduce (each device passes whole tensors around).",
       answer=34),
    _p("data_parallel_calcs.a", Y2026, "written", "an expression and one sentence",
       "Backward FLOPs of one SwiGLU FFN per device with N_DP data parallelism.", answer=35),
    _p("data_parallel_calcs.b", Y2026, "written", "an expression and one sentence",
       "Backward communication time with N_DP.", answer=35),
    _p("data_parallel_calcs.c", Y2026, "written", "an inequality and one sentence",
       "How large N_DP can be before communication-bound.", answer=35),
    _p("fsdp_calcs.a", Y2026, "written", "two expressions and two sentences",
       "Backward and forward FLOPs with N_FSDP.", answer=35),
    _p("fsdp_calcs.b", Y2026, "written", "two expressions and two sentences",
       "Backward and forward communication time with N_FSDP.", answer=35),
    _p("fsdp_calcs.c", Y2026, "written", "two inequalities and two sentences",
       "How large N_FSDP can be before the backward, and the forward, are communication-bound.",
       answer=35),
    _p("tp_calcs.a", Y2026, "written", "the backward pass's equations",
       "The tensor-parallel backward (W1, W2 column-parallel, W3 row-parallel) down to each "
       "device's dW and dx.", answer=35),
    _p("tp_calcs.b", Y2026, "written", "two expressions and two sentences",
       "Forward and backward FLOPs with N_TP.", answer=35),
    _p("tp_calcs.c", Y2026, "written", "two expressions and two sentences",
       "Forward and backward communication time with N_TP.", answer=35),
    _p("tp_calcs.d", Y2026, "written", "two inequalities and two sentences",
       "How large N_TP can be before the backward, and the forward, are communication-bound.",
       answer=35),
    _p("fsdp_tp_calcs.a", Y2026, "written", "an expression and one sentence",
       "Forward FLOPs with N_FSDP x N_TP.", answer=36),
    _p("fsdp_tp_calcs.b", Y2026, "written", "an expression (a max) and one sentence",
       "Forward communication time, the two axes' collectives overlapped.", answer=36),
    _p("fsdp_tp_calcs.c", Y2026, "written", "an inequality with the justification",
       "Under the best split, how large N = N_TP N_FSDP can be before communication-bound.",
       answer=36),
    _p("fsdp_tp_calcs.d", Y2026, "written", "an inequality with the justification",
       "The same when the two axes' collectives cannot overlap.", answer=36),
    _p("leaderboard", Y2026, "written", "the best time of a full training step",
       "One training step (forward, loss, backward, AdamW) of the 8B model (context 32768, vocab "
       "151936, batch 2, bf16) on two GPUs, within 10 minutes from empty caches.", answer=37),
]
# fmt: on
BY_ID = {p["id"]: p for p in PARTS}

# The model each part's handout names (the edition's size names: 2025's xl is 1600/6400/48/25,
# 2026's 2560/10240/32/32): a part answered on another model is answered only partly.
_MEMORY = {"2025": "2.7B", "2026": "xl"}
_XL = {"2025": "xl", "2026": "xl"}
MODEL_ASKED: dict[str, dict[str, str]] = {
    **{f"memory_profiling.{x}": _MEMORY for x in "abcde"},
    "gradient_checkpointing.b": _XL,
    "naive_ddp_benchmarking": _XL,
    "minimal_ddp_flat_benchmarking": _XL,
    "ddp_overlap_individual_parameters_benchmarking.a": _XL,
    "ddp_overlap_individual_parameters_benchmarking.b": _XL,
    "ddp_bucketed_benchmarking.a": _XL,
    "optimizer_state_sharding_accounting.a": _XL,
    "optimizer_state_sharding_accounting.b": _XL,
    "fsdp_accounting.b": _XL,
}

# The handouts' measurement protocol (both editions): benchmarking_script (b) times 10 steps
# after 5 warm-up steps; pytorch_attention (a) times 100 forward and 100 backward passes.
# stage -> {CSV column: the handout's value}
PROTOCOL = {
    "benchmark": {"warmup_steps": 5, "measure_steps": 10},
    "attention": {"fwd_steps": 100, "bwd_steps": 100},
}
# The grid a part's handout asks, per edition: a column of its stage's main CSV -> the values
# asked. A part whose stage has no row that ran (ok, or out of memory: an answer too) at one of
# them is answered only partly.
_ATTENTION = {"d_head": [16, 32, 64, 128], "seq_len": [256, 1024, 4096, 8192, 16384]}
_FLASH = {
    "d_head": [16, 32, 64, 128],
    "seq_len": [2**k for k in range(7, 17)],
    "dtype": ["bf16", "fp32"],
}
_ALLREDUCE = {"world_size": [2, 4, 6], "size_mb": [1, 10, 100, 1024]}
GRID_ASKED: dict[str, dict[str, dict[str, list]]] = {
    "distributed_communication_single_node": {
        "2025": {**_ALLREDUCE, "backend": ["gloo", "nccl"]},
        "2026": {**_ALLREDUCE, "backend": ["nccl"]},
    },
    "pytorch_attention.a": {"2025": _ATTENTION, "2026": _ATTENTION},
    "torch_compile.a": {"2025": _ATTENTION, "2026": _ATTENTION},
    "flash_benchmarking.a": {"2025": _FLASH, "2026": _FLASH},
}
GRID_COLUMNS = sorted({c for eds in GRID_ASKED.values() for g in eds.values() for c in g})


def grid_missing(part_id: str, edition: str, ran: dict[str, list]) -> dict[str, list]:
    """column -> the values the part's handout asks that no row of `ran` (column -> the values
    of the stage's rows that ran) has; {} where the grid is covered or the stage's rows have no
    such column."""
    out = {}
    for col, want in GRID_ASKED.get(part_id, {}).get(str(edition), {}).items():
        if col not in ran:
            continue
        have = {_same(v) for v in ran[col]}
        missing = [v for v in want if _same(v) not in have]
        if missing:
            out[col] = missing
    return out


def _same(value) -> str:
    """A value as a CSV cell or a number reads alike: 1024, 1024.0 and '1024.0' -> '1024'."""
    try:
        return f"{float(value):g}"
    except (TypeError, ValueError):
        return str(value)


# the parts whose handout sets that protocol: stage -> parts (a run that departs from it answers
# them only partly)
PROTOCOL_PARTS = {
    "benchmark": ("benchmarking_script.b", "benchmarking_mixed_precision.c", "torch_compile.b"),
    "attention": ("pytorch_attention.a", "torch_compile.a"),
}
PROTOCOL_WORDS = {
    "warmup_steps": "warm-up steps",
    "measure_steps": "measured steps",
    "fwd_steps": "forward passes",
    "bwd_steps": "backward passes",
}
PROTOCOL_WORD = {  # of one
    "warmup_steps": "warm-up step",
    "measure_steps": "measured step",
    "fwd_steps": "forward pass",
    "bwd_steps": "backward pass",
}


def _counted(vals: list[int], key: str) -> str:
    """`vals` of `key` in words: "1 warm-up step", "1/3 warm-up steps"."""
    words = PROTOCOL_WORD[key] if vals == [1] else PROTOCOL_WORDS[key]
    return f"{'/'.join(map(str, vals))} {words}"


# why a preset departs from the protocol, when it does
PROTOCOL_WHY = {
    "cpu": "the `cpu` preset is sized to run the whole study in minutes on two CPU cores "
    "(docs/budgets.md); the `gpu` and `full` presets run the handout's protocol",
}


def protocol_note(used: dict[str, dict[str, list[int]]], preset: str) -> str:
    """A sentence on the run's protocol against the handout's. `used`: stage -> {column: the
    distinct values its rows recorded}; a stage without rows is left out."""
    same, off = [], []
    for stage, keys in PROTOCOL.items():
        if stage not in used:
            continue
        for key, want in keys.items():
            vals = sorted(used[stage].get(key, []))
            if not vals:
                continue
            if vals == [want]:
                same.append(f"{_counted(vals, key)} ({stage})")
            else:
                off.append(f"{_counted(vals, key)} ({stage}) where the handout asks {want}")
    if not same and not off:
        return ""
    if not off:
        return f"This run follows the handout's protocol: {', '.join(same)}."
    why = PROTOCOL_WHY.get(preset, f"the `{preset}` preset's config (config/stages/) sets them")
    text = f"This run departs from the handout's protocol: {'; '.join(off)}. Why: {why}."
    if same:
        text += f" As the handout asks: {', '.join(same)}."
    return text


def protocol_deviations(used: dict[str, dict[str, list[int]]]) -> dict[str, str]:
    """stage -> how its rows depart from the handout's protocol ('' where they keep it), for
    the stages of PROTOCOL that recorded rows."""
    out = {}
    for stage, keys in PROTOCOL.items():
        if stage not in used:
            continue
        off = [
            f"{_counted(sorted(vals), key)} where the handout asks {want}"
            for key, want in keys.items()
            if (vals := used[stage].get(key)) and sorted(vals) != [want]
        ]
        out[stage] = "; ".join(off)
    return out


# `written` and `code` are the handout's problem parts (the handout's own count); `optional` is
# what a handout asks outside a problem box (2025's FlashAttention leaderboard, section 1.3.3);
# `ours` a question the study adds. The last two are listed apart.
KINDS = ("written", "code", "optional", "ours")
HANDOUT_KINDS = ("written", "code")


def edition_parts(edition: str) -> list[dict]:
    """The parts of `edition` ("2025" or "2026"), in the handout's order."""
    if str(edition) not in EDITIONS:
        raise ValueError(f"unknown edition {edition!r}; known: {EDITIONS}")
    return [p for p in PARTS if str(edition) in p["editions"]]


def handout_parts(edition: str) -> list[dict]:
    """The parts of `edition`'s problems: what the handout counts (written and code)."""
    return [p for p in edition_parts(edition) if p["kind"] in HANDOUT_KINDS]


def own_parts(edition: str) -> list[dict]:
    """The questions beside the handout's problems: optional ones and the study's own."""
    return [p for p in edition_parts(edition) if p["kind"] not in HANDOUT_KINDS]


def model_asked(part_id: str, edition: str) -> str | None:
    """The model size the part's handout names, in the edition's size names (None: any)."""
    return MODEL_ASKED.get(part_id, {}).get(str(edition))


def part_test_files(part: dict) -> list[str]:
    """The test files that check a code part."""
    return [t.strip() for t in part.get("tests", "").split(",") if t.strip()]


def label(part: dict) -> str:
    """`problem (x)`, or `problem` for a problem without lettered parts."""
    return f"{part['problem']} ({part['part']})" if part["part"] else part["problem"]


def anchor(part: dict) -> str:
    """The part's anchor in docs/questions.md (one heading per problem)."""
    return part["problem"].replace("_", "-")


def declarations(stages_dir: Path = STAGES) -> dict[str, dict]:
    """Every stage's `QUESTIONS` literal (part id -> how the report tells), read from source."""
    out = {}
    for init in sorted(Path(stages_dir).glob("*/__init__.py")):
        try:
            out[init.parent.name] = module_literal(SRC, f"cs336_systems.stages.{init.parent.name}",
                                                   "QUESTIONS")  # fmt: skip
        except KeyError:
            out[init.parent.name] = {}
    return out


def answered_by(part_id: str, declared: dict[str, dict]) -> list[str]:
    return [stage for stage, qs in sorted(declared.items()) if part_id in qs]


def stage_orders(stages_dir: Path = STAGES) -> dict[str, int]:
    """Every stage's `ORDER` (its section's place in the report), read from source."""
    return {
        init.parent.name: module_literal(SRC, f"cs336_systems.stages.{init.parent.name}", "ORDER")
        for init in sorted(Path(stages_dir).glob("*/__init__.py"))
    }


def report_numbers(
    declared: dict[str, dict] | None = None, orders: dict[str, int] | None = None
) -> dict[int, int]:
    """The number `Q<n>` the report shows for each answer (a key of ANSWERS): the answers in the
    order the report gives them, by the section of the stage that answers most of their parts
    (its ORDER: the handout's order of parts), then by key. Both editions' reports number alike
    (an answer only one edition asks is skipped in the other's). reporting/digest.py renumbers
    the rendered report with it."""
    declared = declarations() if declared is None else declared
    orders = stage_orders() if orders is None else orders

    def place(answer: int) -> tuple[int, int]:
        parts = [p["id"] for p in PARTS if p["answer"] == answer]
        stages = [st for pid in parts for st in answered_by(pid, declared)]
        most = (
            max((stages.count(st), -orders.get(st, 999)) for st in stages) if stages else (0, -999)
        )
        return -most[1], answer

    return {answer: n for n, answer in enumerate(sorted(ANSWERS, key=place), 1)}


def markdown(declared: dict[str, dict] | None = None) -> str:
    """docs/questions.md: every part of both handouts, grouped by problem."""
    declared = declarations() if declared is None else declared
    lines = [
        "# The questions, part by part",
        "",
        "Written by `python -m cs336_systems.reporting.questions --out docs/questions.md` from",
        "`src/cs336_systems/reporting/questions.py` (the list) and each stage's `QUESTIONS`",
        "declaration (which stage answers a part); `tests/unit/reporting/test_questions.py` fails when this file",
        'is stale. The handouts are the course\'s own (Stanford CS336 assignment 2, "Systems":',
        "spring 2025, version 1.0.4, and spring 2026, version 26.1.1, in the course's public",
        "repository `stanford-cs336/assignment2-systems`); each part is summarized in a line, and",
        "where the two editions differ the line says so. The report's coverage table has one row",
        "per part of its edition and links the report's own list of these lines (its last",
        "section), so that its links work wherever the report is copied.",
        "",
        "Kinds: **written**, a number, table, plot or sentences the report gives (its answer is",
        "the report heading `Q<n>` in the section named); **code**, an implementation (where it",
        "lives, which tests check it: the kernel_tests stage runs them and the report's coverage",
        "table gives their result); **optional**, asked by a handout outside its problem boxes;",
        "**ours**, a question the study adds beside the handout's. The handout's count of parts",
        "is that of its problem boxes' lettered parts (a box without letters is one part),",
        "written and code; the report lists the optional and the study's own questions apart.",
        "Protocol, where a handout sets one: 5 warm-up and 10 measured steps for the end-to-end",
        "benchmarks, 100 forward and 100 backward passes for attention, the edition's own grids;",
        "a preset that deviates (the `cpu` preset: minutes on two cores) says so in its report.",
        "",
    ]
    for ed in ("2025", "2026"):
        parts = edition_parts(ed)
        counts = {k: sum(p["kind"] == k for p in parts) for k in KINDS}
        extra = [f"{counts['optional']} optional"] if counts["optional"] else []
        extra.append(f"{counts['ours']} of the study's own")
        lines.append(
            f"- {ed}: the handout's problems have {len(handout_parts(ed))} parts "
            f"({counts['written']} written, {counts['code']} code); apart from them, "
            f"{' and '.join(extra)}."
        )
    lines.append("")
    problems = list(dict.fromkeys(p["problem"] for p in PARTS))
    numbers = report_numbers(declared)
    for problem in problems:
        parts = [p for p in PARTS if p["problem"] == problem]
        eds = sorted({e for p in parts for e in p["editions"]})
        title = "the study's own questions" if problem == "ours" else f"`{problem}`"
        lines += [
            f'<a id="{problem.replace("_", "-")}"></a>',
            f"## {title}",
            "",
            f"Handout section (2025 / 2026): {SECTIONS.get(problem, '–')}; asked in "
            f"{' and '.join(eds)}.",
            "",
            "| part | editions | kind | deliverable | what it asks | answered in |",
            "|---|---|---|---|---|---|",
        ]
        for p in parts:
            stages = answered_by(p["id"], declared)
            if p["kind"] == "code":
                where = f"`{p['code']}`; tests `{p['tests']}`"
                if p.get("match"):
                    # a pipe inside a table cell is escaped (GitHub renders `\|` as `|`)
                    where += f" (those matching `{p['match'].replace('|', chr(92) + '|')}`)"
            elif p["answer"]:
                sec = ", ".join(f"`{s}`" for s in stages) or "(no stage declares it)"
                where = f"Q{numbers[p['answer']]} ({ANSWERS[p['answer']]}), section {sec}"
            else:
                where = "–"
            lines.append(
                f"| {p['part'] or '–'} | {', '.join(p['editions'])} | {p['kind']} | "
                f"{p['deliverable']} | {p['ask']} | {where} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, help="write the list here (default: print it)")
    args = ap.parse_args(argv)
    text = markdown()
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
