"""Stage `ddp`: DDP variants and optimizer-state sharding: time per step, communication, memory.

`python -m cs336_systems.stages.ddp` measures (see measure.py); analysis.py turns the CSVs into
figures and the report's sentences; plan.py (where present) holds what the workflow needs to plan
the stage's jobs. Keep this file free of heavy imports: the workflow reads it while planning.
"""

TITLE = "Data-parallel training and optimizer-state sharding"
# where the section sits in the report (ascending)
ORDER = 100

# the questions of QUESTIONS.md this stage answers and how the report tells (core/coverage.py)
QUESTIONS = {
    23: {"evidence": ["q23"], "needs": "gpus:2"},
    24: {"evidence": ["q24"], "needs": "gpus:2"},
    25: {"evidence": ["q25"], "needs": "gpus:2"},
    26: {"evidence": ["bucket_table", "best_bucket"], "needs": "gpus:2"},
    27: {"evidence": ["memory_table"], "needs": "gpus:2"},
}

# the numbers the comparison report puts side by side across machines (compare.py)
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
