"""Stage `benchmark`: End-to-end latency of the model over size, context, precision and compilation; warm-up sweep.

`python -m cs336_systems.stages.benchmark` measures (see measure.py); analysis.py turns the CSVs into
figures and the report's sentences; plan.py (where present) holds what the workflow needs to plan
the stage's jobs. Keep this file free of heavy imports: the workflow reads it while planning.
"""

TITLE = "End-to-end benchmarks"
# where the section sits in the report (ascending)
ORDER = 30
# numbers that cannot be right (reporting/sanity.py): a forward+backward slower than the full
# training step of the same point; an MFU against a ceiling of a path the model does not take;
# the warm-up sweep's point without warm-up may have a std above its mean (that is its finding)
SANITY = {
    "benchmark": [
        {
            "kind": "part_slower_than_whole",
            "by": "mode",
            "part": "forward_backward",
            "whole": "train_step",
            "value": "step_ms_mean",
            "keys": ["size", "context_length", "precision", "compile", "attention", "batch_size"],
            "what": "forward+backward slower than the full training step",
        },
        {
            "kind": "part_slower_than_whole",
            "by": "mode",
            "part": "forward",
            "whole": "forward_backward",
            "value": "step_ms_mean",
            "keys": ["size", "context_length", "precision", "compile", "attention", "batch_size"],
            "what": "forward slower than forward+backward (a negative backward time)",
        },
        {
            "kind": "less_work_slower",
            "value": "step_ms_mean",
            "keys": ["context_length", "mode", "precision", "compile", "attention", "batch_size"],
            "what": "slower than a larger model at the same point",
        },
        {"kind": "ceiling_path"},
    ],
    "benchmark_warmup": [{"kind": "std_above_mean", "skip_if": {"warmup_steps": 0}}],
}

# the parts of docs/questions.md this stage answers and how the report tells (reporting/coverage.py)
QUESTIONS = {
    "benchmarking_script.b": {"evidence": ["latency_fp32", "bwd"], "needs": "gpu"},
    "benchmarking_script.c": {"evidence": ["warmup"], "needs": "gpu"},
    "benchmarking_mixed_precision.c": {"evidence": ["bf16.table"], "needs": "gpu"},
    "torch_compile.b": {"evidence": ["compile.table"], "needs": "gpu"},
    "ours.mfu": {"evidence": ["mfu_best", "mfu_table"], "needs": "gpu"},
}

# the numbers the comparison report puts side by side across machines (reporting/compare.py)
COMPARE = {
    "benchmark": {
        "keys": ["size", "context_length", "mode", "precision", "compile", "attention", "engine"],
        "values": {"step_ms_mean": "ms", "mfu": "MFU"},
        # an MFU is against each machine's own measured ceiling: side by side, not divided
        "own_scale": ["mfu"],
        "headlines": [
            {
                "label": "best training-step MFU (%)",
                "column": "mfu",
                "scale": 100,
                "agg": "max",
                "where": {"mode": "train_step"},
            },
            {"label": "best TFLOP/s (any mode)", "column": "tflops", "agg": "max"},
            {
                "label": "median training-step tokens/s",
                "column": "tokens_per_s",
                "agg": "median",
                "where": {"mode": "train_step"},
            },
        ],
    },
}
