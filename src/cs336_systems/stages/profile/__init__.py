"""Stage `profile`: Nsight Systems or torch.profiler captures: kernels per phase, GEMM share, attention's parts.

`python -m cs336_systems.stages.profile` measures (see measure.py); analysis.py turns the CSVs into
figures and the report's sentences; plan.py (where present) holds what the workflow needs to plan
the stage's jobs. Keep this file free of heavy imports: the workflow reads it while planning.
"""

TITLE = "Profiling"
# where the section sits in the report (ascending)
ORDER = 40

# the parts of docs/questions.md this stage answers and how the report tells (reporting/coverage.py)
QUESTIONS = {
    "nsys_profile.a": {"evidence": ["harness_table", "harness_sentence"], "needs": "gpu"},
    "nsys_profile.b": {"evidence": ["top_sentence"], "needs": "gpu"},
    "nsys_profile.c": {"evidence": ["nontrivial_sentence"], "needs": "gpu"},
    "nsys_profile.d": {"evidence": ["gemm_sentence", "other_kernels_sentence"], "needs": "gpu"},
    "nsys_profile.e": {"evidence": ["attention_sentence"], "needs": "gpu"},
}
# numbers that cannot be right (reporting/sanity.py): on one stream the summed kernel time of a step
# cannot exceed the step's own wall time (2% allowance for the range's clock)
SANITY = {
    "profile": [
        {
            "kind": "greater_than",
            "left": "step_kernel_ms_mean",
            "right": "step_range_ms_mean",
            "tolerance": 0.02,
            "why": "summed kernel time above the step's wall time",
        }
    ],
}

# the numbers the comparison report puts side by side across machines (reporting/compare.py)
COMPARE = {
    "profile": {
        "keys": ["size", "context_length", "mode"],
        "values": {"step_ms_mean": "ms under profiler", "gemm_share_step": "GEMM share"},
        "headlines": [
            {
                "label": "median GEMM share of a forward (%)",
                "column": "gemm_share_step",
                "scale": 100,
                "agg": "median",
                "where": {"mode": "forward"},
            },
            {
                "label": "median GEMM share of a training step (%)",
                "column": "gemm_share_step",
                "scale": 100,
                "agg": "median",
                "where": {"mode": "train_step"},
            },
        ],
    },
}
