"""Stage `ddp`: DDP variants and optimizer-state sharding: time per step, communication, memory.

`python -m cs336_systems.stages.ddp` measures (see measure.py); analysis.py turns the CSVs into
figures and the report's sentences; plan.py (where present) holds what the workflow needs to plan
the stage's jobs. Keep this file free of heavy imports: the workflow reads it while planning.
"""

TITLE = "Data-parallel training and optimizer-state sharding"
# where the section sits in the report (ascending)
ORDER = 100

# the parts of docs/questions.md this stage answers and how the report tells (reporting/coverage.py)
QUESTIONS = {
    "naive_ddp_benchmarking": {"evidence": ["q23"], "needs": "gpus:2"},
    "minimal_ddp_flat_benchmarking": {"evidence": ["q24"], "needs": "gpus:2"},
    "ddp_overlap_individual_parameters_benchmarking.a": {"evidence": ["q25"], "needs": "gpus:2"},
    "ddp_overlap_individual_parameters_benchmarking.b": {
        "evidence": ["q25", "traces"],
        "needs": "gpus:2",
    },
    "ddp_bucketed_benchmarking.a": {"evidence": ["bucket_table"], "needs": "gpus:2"},
    "ddp_bucketed_benchmarking.b": {"evidence": ["best_bucket"], "needs": "gpus:2"},
    "optimizer_state_sharding_accounting.a": {"evidence": ["memory_table"], "needs": "gpus:2"},
    "optimizer_state_sharding_accounting.b": {"evidence": ["memory_table"], "needs": "gpus:2"},
    "optimizer_state_sharding_accounting.c": {"evidence": ["memory_table"], "needs": "gpus:2"},
}

# the numbers the comparison report puts side by side across machines (reporting/compare.py)
COMPARE = {
    "ddp": {
        "keys": ["kind", "variant", "bucket_size_mb", "world_size", "size", "context_length"],
        "values": {"step_ms_mean": "step ms", "comm_share": "sync share"},
        "headlines": [
            {
                "label": "median sync share of a step (%)",
                "column": "comm_share",
                "agg": "median",
                "scale": 100,
            },
        ],
    },
}

# the peer's `comm` is the time after backward of a wrapper with nothing left to wait for (its
# reducer waited inside backward): a std above a mean near zero says nothing there
SANITY = {
    "ddp": [
        {"kind": "std_above_mean", "columns": r"^(step|fwd_bwd|opt)_ms_std$"},
        {
            "kind": "std_above_mean",
            "columns": r"^comm_ms_std$",
            "skip_if": {"variant": "torch_ddp"},
        },
    ],
}
